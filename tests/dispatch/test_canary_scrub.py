"""A receiver whose error bodies echo the recipient and the signing secret: a canary scan of every text
column, the API, the admin and the dispatcher's log finds neither in clear (issue 19)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from urllib.parse import quote, quote_plus

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from dispatch.delivery import DispatchLease, Prepared
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dispatch.providers import CachedProvider
from dlq.models import DeadLetter
from notifications.models import DeliveryAttempt, Notification
from providers.scrub import forms, secret_values
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

KEY = TEST_SIGNING_SECRET.removeprefix("whsec_")
# Webhook recipients are opaque tokens: no pattern would know them for what they are.
REFUSED_TO = "cust_Zq8xK2pLmV7w/Ab+Rc9Tn"
FAILING_TO = "Jane.Doe+Canary@Example.org"


def canaries() -> list[str]:
    """Every form of each value that must not appear in clear, lower-cased."""
    found = set()
    for value in (REFUSED_TO, FAILING_TO, TEST_SIGNING_SECRET, KEY):
        found |= {f.lower() for f in forms(value)}
        found.add(value[:12].lower())  # a cut-off echo
    return sorted(found)


def scan_columns() -> list[str]:
    """(table.column) holding a canary, over every text-like column of every table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT table_name, column_name FROM information_schema.columns
            WHERE table_schema = 'public' AND data_type IN ('text', 'character varying', 'json', 'jsonb', 'character')
            """
        )
        columns = cursor.fetchall()
        hits = []
        needles = canaries()
        for table, column in columns:
            cursor.execute(
                f'SELECT count(*) FROM "{table}", unnest(%s::text[]) AS needle '  # noqa: S608 - catalogue names
                f'WHERE strpos(lower("{column}"::text), needle) > 0',
                [needles],
            )
            if cursor.fetchone()[0]:
                hits.append(f"{table}.{column}")
    assert len(columns) > 50, "the scan must cover every table"
    return hits


def in_clear(text: str) -> list[str]:
    lowered = text.lower()
    return [c for c in canaries() if c in lowered]


@pytest.mark.django_db(transaction=True)
def test_a_canary_scan_finds_neither_recipient_nor_secret(tenant_a, api_a, subprocess_env, tmp_path):
    refused_body = json.dumps({"error": "unknown customer", "to": REFUSED_TO, "q": quote(REFUSED_TO, safe=""),
                               "key": KEY}, separators=(",", ":")).encode()  # fmt: skip
    failing_body = (f"upstream down for {FAILING_TO.upper()} ({quote_plus(FAILING_TO)}) "
                    f"signed {TEST_SIGNING_SECRET}").encode()  # fmt: skip
    with (
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, status=400, error_body=refused_body) as refusing,
        HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=60, status=503, error_body=failing_body) as failing,
    ):
        secrets = {"signing_secret": TEST_SIGNING_SECRET}
        p400 = factories.provider(tenant_a, "refusing", config={"url": refusing.url}, secrets=secrets)
        p503 = factories.provider(tenant_a, "failing", config={"url": failing.url}, secrets=secrets, max_attempts=2)
        refused = factories.queued(tenant_a, p400, 2, recipient=REFUSED_TO)
        dead = factories.queued(tenant_a, p503, 2, recipient=FAILING_TO)
        env = {**subprocess_env, "OMNIPOST_RETRY_BASE_SECONDS": "0.05", "OMNIPOST_RETRY_MAX_SECONDS": "0.1"}
        procs = start_dispatchers(1, env, "--batch-size", "10", log_dir=tmp_path)
        try:
            assert wait_started(tmp_path, 1)
            ids = [n.pk for n in refused + dead]
            assert wait_until(
                lambda: Notification.objects.filter(pk__in=ids, status__in=["failed", "dead_lettered"]).count() == 4,
                30,
            )
        finally:
            for proc in procs:
                proc.terminate()
            assert wait_exit(procs, 20) == [0]
        assert refusing.requests and failing.requests and all(r.verified for r in refusing.requests)

    # What the receivers said did arrive, masked: 2 refusals, 2 × 2 transient failures.
    assert DeliveryAttempt.objects.count() == 6 and DeadLetter.objects.count() == 4
    messages = " | ".join(DeliveryAttempt.objects.values_list("error_message", flat=True))
    assert "unknown customer" in messages and "upstream down for" in messages and "****" in messages, messages

    assert scan_columns() == []

    pages = {f"GET notifications/{n.pk}": api_a.get(f"/api/v1/notifications/{n.pk}") for n in refused + dead}
    pages["GET dlq"] = api_a.get("/api/v1/dlq")
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.invalid", "pw-0123456789"))
    pages["admin dlq list"] = admin.get("/admin/dlq/deadletter/")
    for entry in DeadLetter.objects.all():
        pages[f"admin dlq {entry.pk}"] = admin.get(f"/admin/dlq/deadletter/{entry.pk}/change/")
    pages["admin notifications"] = admin.get("/admin/notifications/notification/")
    for n in refused + dead:
        pages[f"admin notification {n.pk}"] = admin.get(f"/admin/notifications/notification/{n.pk}/change/")
    for where, response in pages.items():
        assert response.status_code == 200, where
        assert in_clear(response.content.decode()) == [], where
    assert "unknown customer" in pages["GET dlq"].content.decode()  # the reasons are shown, masked

    log = (tmp_path / "dispatcher0.log").read_text()
    assert "permanent failure of" in log and "dead-lettered after 2 attempts" in log, log
    assert in_clear(log) == [], log


class CrashingProvider:
    """A provider whose exception quotes the recipient and the signing key (a client library's
    error message often does)."""

    async def send(self, message):  # noqa: ANN001, ANN201
        raise ValueError(f"cannot deliver to {message.recipient!r} with key {quote(KEY, safe='')}")

    def start_send(self, message, on_result) -> None:  # noqa: ANN001
        return None

    async def aclose(self) -> None:
        return None


def test_a_crashing_provider_is_scrubbed_in_the_attempt_the_reason_and_the_traceback(caplog):
    async def run():  # noqa: ANN202
        dispatcher = Dispatcher(DispatcherConfig(concurrency=10, batch_size=10, jitter=False))
        dispatcher.bind(asyncio.get_running_loop())
        dispatcher.providers.entries[7] = CachedProvider(
            CrashingProvider(), datetime.now(UTC), 1, False, time.monotonic(),
            secret_values({"signing_secret": TEST_SIGNING_SECRET}),
        )  # fmt: skip
        lease = DispatchLease(1, uuid.uuid4(), 7, False, str(uuid.uuid4()), str(uuid.uuid4()))
        item = Prepared(lease, "webhook", "", "s", "b", {}, datetime.now(UTC), 1, 1, opened_recipient=REFUSED_TO)
        dispatcher.sender.start(item)
        async with asyncio.timeout(5):
            while not dispatcher.recorder.pending:
                await asyncio.sleep(0.01)
        return dispatcher.recorder.pending

    with caplog.at_level(logging.INFO, logger="omnipost.dispatcher"):
        (outcome,) = asyncio.run(run())
    assert outcome.kind == "dead_lettered" and outcome.attempt.error_code == "provider_crash"
    assert "cannot deliver to" in outcome.attempt.error_message and "cust_****" in outcome.failure_reason
    assert "provider crashed delivering" in caplog.text and "Traceback" in caplog.text
    for text in (outcome.attempt.error_message, outcome.failure_reason, caplog.text):
        assert in_clear(text) == [], text
