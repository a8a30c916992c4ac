"""The native push kinds against loopback stand-ins that check what the vendors check (tests.push.standins):
APNs over HTTP/2 with ES256 provider tokens, FCM HTTP v1 behind an RS256 JWT-bearer grant, Web Push
encrypted per RFC 8291 (decrypted by the stand-in with http_ece) and signed per RFC 8292."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from providers.kinds import build_provider
from providers.kinds.base import OutboundMessage
from tests.push.standins import Answer, ApnsStandIn, FcmStandIn, WebPushStandIn

pytestmark = pytest.mark.timeout(60)

DEVICE = "a1" * 32
OTHER = "b2" * 32


def message(recipient: str, **push: object) -> OutboundMessage:
    return OutboundMessage(
        notification_id=str(uuid.uuid4()), tenant_id=str(uuid.uuid4()), channel="push", recipient=recipient,
        subject="Your order", body="It has shipped", push=push or None,
    )  # fmt: skip


@pytest.fixture
def apns(tmp_path):
    standin = ApnsStandIn(tmp_path).start()
    yield standin
    standin.stop()


@pytest.fixture
def fcm():
    standin = FcmStandIn().start()
    yield standin
    standin.stop()


@pytest.fixture
def webpush():
    standin = WebPushStandIn().start()
    yield standin
    standin.stop()


def run(provider, coro_factory):
    async def main():
        try:
            return await coro_factory()
        finally:
            await provider.aclose()

    return asyncio.run(main())


# --- APNs -----------------------------------------------------------------------------------------


def test_apns_delivers_with_a_verified_provider_token_and_the_required_headers(apns):
    provider = build_provider("apns", *apns.provider_config())
    sent = message(DEVICE, data={"order": "42"}, badge=3, sound="ping.caf", collapse_key="order-42",
                   urgency="normal", ttl_seconds=600)  # fmt: skip
    result = run(provider, lambda: provider.send(sent))
    assert result.delivered and result.http_status == 200, result
    assert apns.refused == []
    (got,) = apns.accepted(DEVICE)
    assert got["payload"] == {"aps": {"alert": {"title": "Your order", "body": "It has shipped"}, "badge": 3,
                                      "sound": "ping.caf"}, "order": "42"}  # fmt: skip
    headers = got["headers"]
    assert headers["apns-id"] == sent.notification_id and headers["apns-topic"] == ApnsStandIn.TOPIC
    assert headers["apns-push-type"] == "alert" and headers["apns-priority"] == "5"
    assert headers["apns-collapse-id"] == "order-42"
    assert abs(int(headers["apns-expiration"]) - (time.time() + 600)) < 5


@pytest.mark.parametrize(
    ("answer", "deactivate", "permanent"),
    [
        (Answer(410), "Unregistered", True),
        (Answer(400, "BadDeviceToken"), "BadDeviceToken", True),
        (Answer(400, "DeviceTokenNotForTopic"), "DeviceTokenNotForTopic", True),
        (Answer(400, "BadCollapseId"), "", True),
        (Answer(429, headers={"retry-after": "7"}), "", None),
        (Answer(503), "", None),
    ],
)
def test_apns_answers_per_token(apns, answer, deactivate, permanent):
    apns.answer(DEVICE, answer)
    provider = build_provider("apns", *apns.provider_config())
    result = run(provider, lambda: provider.send(message(DEVICE)))
    assert not result.delivered and result.http_status == answer.status
    assert result.deactivate == deactivate and result.permanent is permanent
    if answer.headers:
        assert result.retry_after == 7.0
    from dlq.classifier import classify

    assert classify(result).permanent is bool(permanent)


def test_apns_multiplexes_sends_on_one_connection_with_one_token(apns):
    for i in range(40):
        apns.answer(f"{i:02x}" * 32, Answer(delay=0.2))
    provider = build_provider("apns", *apns.provider_config())

    async def many():
        return await asyncio.gather(*(provider.send(message(f"{i:02x}" * 32)) for i in range(40)))

    results = run(provider, many)
    assert all(r.delivered for r in results)
    assert provider._client.connections_opened == 1
    assert provider._client.most_in_flight >= 20 and apns.most_in_flight >= 20
    assert provider.tokens_made == 1 and len(apns.provider_tokens) == 1


def test_an_expired_provider_token_is_replaced_once_and_the_sends_go_on_at_once(apns):
    provider = build_provider("apns", *apns.provider_config())

    async def scenario():
        first = await provider.send(message(DEVICE))
        apns.expire_next = True  # the token in use becomes stale at APNs
        again = await asyncio.gather(*(provider.send(message(f"{i:02x}" * 32)) for i in range(10)))
        return first, again

    first, again = run(provider, scenario)
    assert first.delivered and all(r.delivered for r in again), again
    assert provider.tokens_made == 2  # one new token for the ten sends that met ExpiredProviderToken
    assert len(apns.provider_tokens) == 2 and apns.refused == []


def test_the_provider_token_is_reused_then_renewed_after_50_minutes(apns, monkeypatch):
    provider = build_provider("apns", *apns.provider_config())

    async def scenario():
        await provider.send(message(DEVICE))
        await provider.send(message(DEVICE))
        provider._token_made -= 49 * 60
        await provider.send(message(DEVICE))
        assert provider.tokens_made == 1
        provider._token_made -= 2 * 60
        await provider.send(message(DEVICE))

    run(provider, scenario)
    assert provider.tokens_made == 2 and len(apns.accepted(DEVICE)) == 4


def test_apns_refuses_a_token_that_is_not_hex_without_sending(apns):
    provider = build_provider("apns", *apns.provider_config())
    result = run(provider, lambda: provider.send(message("not-a-token")))
    assert result.error_code == "invalid_recipient" and result.permanent and apns.seen == {}


# --- FCM ------------------------------------------------------------------------------------------


def test_fcm_one_grant_shared_by_concurrent_sends_and_a_verified_message(fcm):
    fcm.grant_delay = 0.3  # the sends all arrive while the one grant is in flight
    provider = build_provider("fcm", *fcm.provider_config())

    async def many():
        return await asyncio.gather(*(provider.send(message(f"tok-{i}", data={"k": "v"}, collapse_key="c1"))
                                      for i in range(20)))  # fmt: skip

    results = run(provider, many)
    assert all(r.delivered for r in results), results
    assert fcm.grants == 1 and provider.tokens_fetched == 1 and fcm.refused == []
    got = fcm.accepted("tok-3")[0]["message"]
    assert got["notification"] == {"title": "Your order", "body": "It has shipped"}
    assert got["data"] == {"k": "v"} and got["android"]["collapse_key"] == "c1"
    assert results[0].provider_message_id.startswith(f"projects/{FcmStandIn.PROJECT}/messages/")


def test_fcm_renews_its_token_before_expiry_and_after_a_401(fcm):
    provider = build_provider("fcm", *fcm.provider_config())

    async def scenario():
        assert (await provider.send(message("t1"))).delivered
        assert (await provider.send(message("t2"))).delivered
        assert fcm.grants == 1
        loop = asyncio.get_running_loop()
        # 5 minutes before expiry (expires_in 3600): renewed
        assert 3600 - 300 - 5 < provider._renew_at - loop.time() <= 3600 - 300
        provider._renew_at = loop.time()
        assert (await provider.send(message("t3"))).delivered
        assert fcm.grants == 2
        fcm.issued.clear()  # every token revoked: a 401, a new grant, the send again
        assert (await provider.send(message("t4"))).delivered
        assert fcm.grants == 3

    run(provider, scenario)


def test_fcm_sends_through_callbacks_once_it_has_a_token_and_a_401_renews_it(fcm):
    provider = build_provider("fcm", *fcm.provider_config())

    async def scenario():
        loop = asyncio.get_running_loop()
        assert provider.start_send(message("t0"), lambda r: None) is None  # no token yet: `send` fetches it
        assert (await provider.send(message("t1"))).delivered

        async def started(recipient: str):
            future = loop.create_future()
            handle = provider.start_send(message(recipient), future.set_result)
            assert handle is not None and not future.done()  # called back later, never from within
            return await future

        assert (await started("t2")).delivered and fcm.grants == 1
        fcm.issued.clear()  # every token revoked: a 401, a new grant, the send again
        assert (await started("t3")).delivered and fcm.grants == 2
        refused = await started("bad token")
        assert (refused.delivered, refused.error_code) == (False, "invalid_recipient")
        fcm.answer("t4", Answer(delay=5))
        cancelled = []
        provider.start_send(message("t4"), cancelled.append).cancel()
        await asyncio.sleep(0.2)
        assert cancelled == []  # given up: no callback

    run(provider, scenario)
    assert [r["token"] for r in fcm.received] == ["t1", "t2", "t3"]


@pytest.mark.parametrize(
    ("answer", "deactivate", "permanent"),
    [
        (Answer(404), "UNREGISTERED", True),
        (Answer(400, "INVALID_ARGUMENT"), "INVALID_ARGUMENT", True),
        (Answer(400, "INVALID_ARGUMENT", about_token=False), "", True),
        (Answer(403, "SENDER_ID_MISMATCH"), "", True),
        (Answer(503, headers={"retry-after": "11"}), "", None),
        (Answer(500), "", None),
        (Answer(429), "", None),
    ],
)
def test_fcm_answers_per_token(fcm, answer, deactivate, permanent):
    fcm.answer("tok", answer)
    provider = build_provider("fcm", *fcm.provider_config())
    result = run(provider, lambda: provider.send(message("tok")))
    assert not result.delivered and result.deactivate == deactivate and result.permanent is permanent
    if answer.headers:
        assert result.retry_after == 11.0


# --- Web Push -------------------------------------------------------------------------------------


def test_webpush_body_decrypts_to_what_was_sent_and_vapid_is_signed_once_per_origin(webpush):
    import json

    subs = [webpush.subscribe(f"s{i}") for i in range(3)]
    provider = build_provider("webpush", *webpush.provider_config())

    async def scenario():
        return [await provider.send(message(json.dumps(s.as_json()), data={"a": "1"}, action_url="https://x.example/o",
                                            collapse_key="order 42/updates", ttl_seconds=60, urgency="normal"))
                for s in subs]  # fmt: skip

    results = run(provider, scenario)
    assert all(r.delivered for r in results), results
    assert webpush.refused == []
    got = webpush.accepted("s1")[0]
    assert got["payload"] == {"title": "Your order", "body": "It has shipped", "data": {"a": "1"},
                              "action_url": "https://x.example/o"}  # fmt: skip
    assert got["headers"]["ttl"] == "60" and got["headers"]["urgency"] == "normal"
    assert len(got["headers"]["topic"]) <= 32
    assert provider.vapid_signed == 1 and len(webpush.vapid_tokens) == 1


def test_webpush_sends_through_callbacks(webpush):
    import json

    sub = webpush.subscribe("cb")
    provider = build_provider("webpush", *webpush.provider_config())

    async def scenario():
        loop = asyncio.get_running_loop()
        results = []
        for recipient in (json.dumps(sub.as_json()), "not a subscription"):
            future = loop.create_future()
            assert provider.start_send(message(recipient, data={"k": "v"}), future.set_result) is not None
            assert not future.done()  # called back later, never from within
            results.append(await future)
        return results

    sent, refused = run(provider, scenario)
    assert sent.delivered and (refused.delivered, refused.error_code) == (False, "invalid_recipient")
    assert [r["payload"]["data"] for r in webpush.accepted("cb")] == [{"k": "v"}] and webpush.refused == []


@pytest.mark.parametrize(
    ("status", "deactivate", "permanent"),
    [(410, "http_410", True), (404, "http_404", True), (503, None, None), (413, None, None)],
)
def test_webpush_answers(webpush, status, deactivate, permanent):
    import json

    sub = webpush.subscribe("s")
    webpush.answer("s", Answer(status))
    provider = build_provider("webpush", *webpush.provider_config())
    result = run(provider, lambda: provider.send(message(json.dumps(sub.as_json()))))
    assert not result.delivered and result.http_status == status
    assert result.deactivate == (deactivate or "") and result.permanent is permanent
    from dlq.classifier import classify

    assert classify(result).permanent is (status != 503)


def test_webpush_endpoints_are_held_to_the_ssrf_rules_at_connect_time(webpush, settings):
    import json

    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    sub = webpush.subscribe("s")
    provider = build_provider("webpush", *webpush.provider_config())
    result = run(provider, lambda: provider.send(message(json.dumps(sub.as_json()))))
    assert not result.delivered and result.permanent  # http:// is not allowed either then
    https = dict(sub.as_json(), endpoint=f"https://127.0.0.1:{webpush.server.port}/push/s")
    provider = build_provider("webpush", *webpush.provider_config())
    result = run(provider, lambda: provider.send(message(json.dumps(https))))
    assert result.error_code == "destination_forbidden" and webpush.seen == {}
