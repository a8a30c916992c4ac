"""A provider edited (URL changed, signing secret rotated) while 20 of its sends are in flight, on a
real dispatcher process: the edit takes effect for the next claim, the sends in flight finish on
the old client (which closes only then), and nothing is sent twice."""

from __future__ import annotations

import base64
import collections
import signal

import pytest
from standardwebhooks import Webhook

from notifications.models import DeliveryAttempt, Notification
from providers.models import Provider
from queueing.models import QueueItem
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True)

OLD = TEST_SIGNING_SECRET
NEW = "whsec_" + base64.b64encode(bytes(range(101, 133))).decode()
HOLD_SECONDS = 1.5  # how long the receiver keeps each request before answering


def test_a_provider_edited_while_twenty_of_its_sends_are_in_flight_sends_nothing_twice(
    tenant_a, api_a, subprocess_env, tmp_path
):
    with HttpReceiver(secret=OLD, delay_ms=HOLD_SECONDS * 1000, max_seconds=120) as receiver:
        base = receiver.url.rsplit("/", 1)[0]
        created = api_a.post("/api/v1/providers", {
            "name": "hook", "channel": "webhook", "kind": "webhook", "config": {"url": f"{base}/v1"},
            "secrets": {"signing_secret": OLD},
        }, format="json")  # fmt: skip
        assert created.status_code == 201, created.json()
        prov = Provider.objects.get(name="hook")
        first = factories.queued(tenant_a, prov, 20)
        (proc,) = start_dispatchers(1, subprocess_env, "--concurrency", "40", "--batch-size", "50", log_dir=tmp_path)
        assert wait_started(tmp_path, 1)
        assert wait_until(lambda: len(receiver.requests) >= 20, 20), "20 sends in flight"

        edited = api_a.patch("/api/v1/providers/hook", {
            "config": {"url": f"{base}/v2", "timeout_seconds": 8}, "secrets": {"signing_secret": NEW},
        }, format="json")  # fmt: skip
        assert edited.status_code == 200, edited.json()
        second = factories.queued(tenant_a, prov, 20)
        everyone = {str(n.id) for n in first + second}
        assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 40, 30)

        # Idle now: the next claim is the one a ring wakes, which checks providers too.
        assert wait_until(lambda: not QueueItem.objects.exists(), 10)
        receiver.configure(delay_ms=0)
        edited = api_a.patch("/api/v1/providers/hook", {"config": {"url": f"{base}/v3"}}, format="json")
        assert edited.status_code == 200, edited.json()
        third = factories.queued(tenant_a, prov, 5)
        assert wait_until(lambda: Notification.objects.filter(status="delivered").count() == 45, 30)
        proc.send_signal(signal.SIGTERM)
        assert wait_exit([proc], 20) == [0]
        requests = receiver.requests

    assert {r.path for r in requests if r.webhook_id in {str(n.id) for n in third}} == {"/v3"}
    requests = [r for r in requests if r.webhook_id in everyone]
    counts = collections.Counter(r.webhook_id for r in requests)
    assert set(counts) == everyone and max(counts.values()) == 1, "0 duplicates, not a single retry"
    assert all(r.status == 200 and r.verified for r in requests)
    by_id = {r.webhook_id: r for r in requests}
    old_sends = [by_id[str(n.id)] for n in first]
    new_sends = [by_id[str(n.id)] for n in second]
    assert {r.path for r in old_sends} == {"/v1"}
    assert {r.path for r in new_sends} == {"/v2"}, "the edit took effect for the next claim"
    # ... while the first 20 were still in flight (each held HOLD_SECONDS before its answer).
    assert min(r.received_at for r in new_sends) < min(r.received_at for r in old_sends) + HOLD_SECONDS
    for r in old_sends:
        assert r.headers["webhook-signature"].count("v1,") == 1
        Webhook(OLD).verify(r.body, r.headers)
    for r in new_sends:  # the rotated secret signs the next sends, the old one beside it (grace)
        Webhook(NEW).verify(r.body, r.headers)
        Webhook(OLD).verify(r.body, r.headers)
    assert DeliveryAttempt.objects.count() == 45
    assert set(DeliveryAttempt.objects.values_list("outcome", "number")) == {("delivered", 1)}
    assert QueueItem.objects.count() == 0


def test_a_replaced_instance_is_closed_only_once_its_sends_in_flight_are_done(tenant_a):
    """In-process, step by step: the claim after an edit builds a new instance; the old one keeps
    its connections until its sends have answered, then closes them."""
    import asyncio

    from django.db import connection
    from django.db.models.functions import Now

    from dispatch.dispatcher import Dispatcher, DispatcherConfig

    def on_db_thread(fn, *args):  # noqa: ANN001, ANN202 - its own connection, closed after
        try:
            return fn(*args)
        finally:
            connection.close()

    with HttpReceiver(secret=OLD, delay_ms=400, max_seconds=60) as receiver:
        prov = factories.provider(tenant_a, config={"url": receiver.url}, secrets={"signing_secret": OLD})
        factories.queued(tenant_a, prov, 5)

        async def scenario() -> tuple[list[str], bool, bool, int]:
            dispatcher = Dispatcher(DispatcherConfig(jitter=False, concurrency=10, batch_size=10))
            dispatcher.bind(asyncio.get_running_loop())
            prepared = (await asyncio.to_thread(on_db_thread, dispatcher.claimer.claim, 10)).send
            dispatcher._start_all(prepared)
            old = dispatcher.providers.entries[prov.pk].instance
            await asyncio.sleep(0.1)  # the five requests are on the wire
            await asyncio.to_thread(on_db_thread, lambda: Provider.objects.filter(pk=prov.pk).update(updated_at=Now()))
            await asyncio.to_thread(on_db_thread, dispatcher.providers.load, {prov.pk})
            await asyncio.sleep(0.01)
            replaced = dispatcher.providers.entries[prov.pk].instance is not old
            closed_under_sends = old._client._closed
            while dispatcher.sender.inflight:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.05)
            closed_after = old._client._closed
            await dispatcher.providers.entries[prov.pk].instance.aclose()
            return [o.kind for o in dispatcher.recorder.pending], replaced, closed_under_sends, closed_after

        kinds, replaced, closed_under_sends, closed_after = asyncio.run(scenario())
    assert replaced and not closed_under_sends and closed_after
    assert kinds == ["delivered"] * 5
    assert len(receiver.requests) == 5
