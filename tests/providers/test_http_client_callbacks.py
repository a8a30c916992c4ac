"""The HTTP client's callback API (`HttpClient.start`, `WebhookProvider.start_send`): the dispatcher's
hot path, which sends without a task, coroutine or future per request. Against real loopback servers."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from core.http import HttpConnectError, HttpTimeout, build_head, split_url
from providers.kinds.webhook import WebhookProvider
from providers.transport import new_client
from tests.providers.test_webhook import SECRETS, message
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver


def post(url: str, tag: str) -> tuple:
    """(origin, head, body) of a small POST whose body names it."""
    origin, target = split_url(url)
    body = f'{{"tag": "{tag}"}}'.encode()
    return origin, build_head("POST", origin, target, {"Content-Type": "application/json"}, len(body)), body


class Calls:
    """Collects callbacks; `wait(n)` until n have come."""

    def __init__(self) -> None:
        self.results: dict[str, tuple] = {}
        self.order: list[str] = []
        self.changed = asyncio.Event()

    def for_(self, tag: str):  # noqa: ANN201
        def done(response, error) -> None:  # noqa: ANN001
            assert tag not in self.results, f"{tag} called back twice"
            self.results[tag] = (response, error)
            self.order.append(tag)
            self.changed.set()

        return done

    async def wait(self, count: int, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.results) < count:
                self.changed.clear()
                await self.changed.wait()


def bodies(rx: HttpReceiver) -> list[str]:
    return [r.payload["tag"] for r in rx.requests]


def test_start_calls_back_once_after_returning_and_reuses_the_connection():
    with HttpReceiver() as rx:

        async def run():
            client = new_client()
            calls = Calls()
            req = client.start(*post(rx.url, "a"), 2.0, calls.for_("a"))
            assert calls.results == {}, "no callback from within start()"
            await calls.wait(1)
            client.start(*post(rx.url, "b"), 2.0, calls.for_("b"))
            await calls.wait(2)
            await asyncio.sleep(0.05)  # a second callback would come now
            await client.aclose()
            return req, calls

        req, calls = asyncio.run(run())
    (response, error) = calls.results["a"]
    assert error is None and response.status == 200 and req.done
    assert calls.order == ["a", "b"] and calls.results["b"][0].status == 200
    assert rx.stats()["connections"] == 1 and bodies(rx) == ["a", "b"]


def test_waiting_requests_take_the_connection_in_order_as_each_answer_arrives():
    with HttpReceiver(delay_ms=10) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            calls = Calls()
            tags = [f"r{i}" for i in range(6)]
            for tag in tags:
                client.start(*post(rx.url, tag), 5.0, calls.for_(tag))
            await calls.wait(len(tags))
            await client.aclose()
            return tags, calls

        tags, calls = asyncio.run(run())
    assert calls.order == tags and all(err is None for _, err in calls.results.values())
    assert bodies(rx) == tags and rx.stats()["connections"] == 1


def test_a_cancelled_waiting_request_is_neither_sent_nor_called_back():
    with HttpReceiver(delay_ms=50) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            calls = Calls()
            client.start(*post(rx.url, "first"), 5.0, calls.for_("first"))
            dropped = client.start(*post(rx.url, "dropped"), 5.0, calls.for_("dropped"))
            client.start(*post(rx.url, "last"), 5.0, calls.for_("last"))
            dropped.cancel()
            await calls.wait(2)
            await asyncio.sleep(0.1)
            await client.aclose()
            return calls

        calls = asyncio.run(run())
    assert calls.order == ["first", "last"]
    assert bodies(rx) == ["first", "last"]


def test_a_cancelled_request_in_flight_closes_its_connection_and_the_next_one_opens_another():
    with HttpReceiver(delay_ms=300) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            calls = Calls()
            abandoned = client.start(*post(rx.url, "abandoned"), 5.0, calls.for_("abandoned"))
            waiting = client.start(*post(rx.url, "waiting"), 5.0, calls.for_("waiting"))
            await asyncio.sleep(0.1)  # "abandoned" is on the wire, "waiting" waits for its connection
            abandoned.cancel()
            rx.configure(delay_ms=0)
            await calls.wait(1)
            await asyncio.sleep(0.35)  # the receiver's late answer to "abandoned" finds the socket closed
            count = client.connection_count()
            await client.aclose()
            return calls, waiting, count

        calls, waiting, count = asyncio.run(run())
    assert calls.order == ["waiting"] and calls.results["waiting"][1] is None and waiting.done
    assert rx.stats()["connections"] == 2 and count == 1


def test_timeouts_waiting_and_in_flight_arrive_as_errors_through_the_callback():
    with HttpReceiver(delay_ms=500) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            calls = Calls()
            client.start(*post(rx.url, "slow"), 0.1, calls.for_("slow"))
            client.start(*post(rx.url, "queued"), 0.1, calls.for_("queued"))
            await calls.wait(2, timeout=2)
            await client.aclose()
            return calls

        calls = asyncio.run(run())
    assert {tag: type(err) for tag, (_, err) in calls.results.items()} == {"slow": HttpTimeout, "queued": HttpTimeout}
    assert "no free connection" in str(calls.results["queued"][1])


def test_a_closed_client_refuses_at_once_and_fails_its_waiting_requests():
    with HttpReceiver(delay_ms=200) as rx:

        async def run():
            client = new_client(max_connections_per_host=1)
            calls = Calls()
            client.start(*post(rx.url, "sent"), 5.0, calls.for_("sent"))
            client.start(*post(rx.url, "waiting"), 5.0, calls.for_("waiting"))
            await asyncio.sleep(0.05)
            await client.aclose()
            await calls.wait(2)
            with pytest.raises(HttpConnectError, match="client closed"):
                client.start(*post(rx.url, "late"), 5.0, calls.for_("late"))
            return calls

        calls = asyncio.run(run())
    errors = {tag: err for tag, (_, err) in calls.results.items()}
    assert isinstance(errors["waiting"], HttpConnectError) and "client closed" in str(errors["waiting"])
    assert errors["sent"] is not None  # its connection was closed under it
    assert "late" not in calls.results


def test_connect_errors_reach_the_callback():
    async def run():
        client = new_client()
        calls = Calls()
        origin, head, body = post("http://127.0.0.1:9/hook", "refused")  # discard port: nothing listens
        client.start(origin, head, body, 2.0, calls.for_("refused"))
        await calls.wait(1)
        await client.aclose()
        return calls

    (_, error) = asyncio.run(run()).results["refused"]
    assert isinstance(error, HttpConnectError)


def test_webhook_start_send_delivers_a_signed_request_and_reports_failures_as_results():
    with HttpReceiver(secret=TEST_SIGNING_SECRET) as rx:

        async def run():
            provider = WebhookProvider({"url": rx.url}, SECRETS)
            results: list = []
            got = asyncio.Event()

            def on_result(result) -> None:  # noqa: ANN001
                results.append(result)
                got.set()

            ok = message()
            provider.start_send(ok, on_result)
            assert results == [], "no callback from within start_send()"
            await asyncio.wait_for(got.wait(), 5)
            got.clear()
            handle = provider.start_send(message(notification_id="bad id\r\n"), on_result)
            await asyncio.wait_for(got.wait(), 5)
            cancelled = message()
            provider.start_send(cancelled, on_result).cancel()  # sent already (a connection was idle)
            await provider.aclose()
            got.clear()
            provider.start_send(message(), on_result)  # its client is closed now
            await asyncio.wait_for(got.wait(), 5)
            await asyncio.sleep(0.05)
            return ok, cancelled, results, handle

        ok, cancelled, results, handle = asyncio.run(run())
    delivered, malformed, closed = results
    assert delivered.delivered and delivered.http_status == 200
    assert not malformed.delivered and malformed.error_code == "malformed_content" and malformed.permanent
    assert not closed.delivered and closed.error_code == "connect_error"
    assert len(results) == 3  # nothing from the cancelled send
    assert isinstance(handle, asyncio.Handle)
    assert [r.webhook_id for r in rx.requests] == [ok.notification_id, cancelled.notification_id]
    assert all(r.verified for r in rx.requests)


def test_a_provider_without_a_callback_path_says_so():
    from providers.kinds.console import ConsoleProvider

    provider = ConsoleProvider({}, {})
    assert provider.start_send(message(notification_id=str(uuid.uuid4())), lambda result: None) is None


def test_callbacks_that_raise_or_start_requests_leave_the_pool_and_its_timeouts_working():
    """Callbacks run inside the sweeper: one that starts a request (same origin, a new origin) or
    raises must not stop it, or no timeout would ever fire again."""
    with HttpReceiver(delay_ms=2000) as rx, HttpReceiver(delay_ms=2000) as other:

        async def run():
            loop = asyncio.get_running_loop()
            reported: list = []
            loop.set_exception_handler(lambda _, context: reported.append(context.get("exception")))
            client = new_client(max_connections_per_host=1)
            calls = Calls()
            record_then = calls.for_

            def and_start(tag: str, url: str, follow: str):  # noqa: ANN202
                def done(response, error) -> None:  # noqa: ANN001
                    record_then(tag)(response, error)
                    client.start(*post(url, follow), 0.2, calls.for_(follow))

                return done

            def raising(tag: str):  # noqa: ANN202
                def done(response, error) -> None:  # noqa: ANN001
                    record_then(tag)(response, error)
                    raise ValueError("a bug in a callback")

                return done

            client.start(*post(rx.url, "holder"), 0.6, calls.for_("holder"))
            client.start(*post(rx.url, "later"), 0.5, calls.for_("later"))  # deadlines out of order
            client.start(*post(rx.url, "same"), 0.1, and_start("same", rx.url, "same-follow"))
            client.start(*post(rx.url, "new"), 0.1, and_start("new", other.url, "new-follow"))
            client.start(*post(rx.url, "raises"), 0.1, raising("raises"))
            await calls.wait(7, timeout=3)
            await client.aclose()
            return calls, reported

        calls, reported = asyncio.run(run())
    assert set(calls.results) == {"holder", "later", "same", "same-follow", "new", "new-follow", "raises"}
    assert all(isinstance(err, HttpTimeout) for _, err in calls.results.values())
    assert [type(e) for e in reported] == [ValueError]


def test_a_callback_that_raises_on_its_response_does_not_resend_the_next_request():
    with HttpReceiver(delay_ms=20) as rx:

        async def run():
            loop = asyncio.get_running_loop()
            loop.set_exception_handler(lambda *_: None)
            client = new_client(max_connections_per_host=1)
            calls = Calls()

            def raising(response, error) -> None:  # noqa: ANN001
                calls.for_("first")(response, error)
                raise ValueError("a bug in a callback")

            client.start(*post(rx.url, "first"), 5.0, raising)
            client.start(*post(rx.url, "second"), 5.0, calls.for_("second"))  # waits for that connection
            await calls.wait(2)
            await asyncio.sleep(0.1)
            await client.aclose()
            return calls

        calls = asyncio.run(run())
    assert [calls.results[t][0].status for t in ("first", "second")] == [200, 200]
    assert bodies(rx) == ["first", "second"] and rx.stats()["connections"] == 1
