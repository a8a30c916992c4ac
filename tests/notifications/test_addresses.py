"""notifications.addresses: a batch of receipts' hard bounces and complaints puts their
notifications' addresses on the suppression list, in two statements whatever the batch's size."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from notifications import services
from notifications.addresses import suppress_notifications
from recipients import suppressions

pytestmark = pytest.mark.django_db


def test_receipts_suppress_their_notifications_addresses_in_two_statements(setup_a, setup_b):
    def create(setup, channel: str, recipient: str):  # noqa: ANN001, ANN202
        provider = {"email": setup.mail, "sms": setup.text, "push": setup.push}[channel]
        spec = services.NotificationSpec(channel=channel, recipient=recipient, provider=provider, body="b")
        return services.create_notifications(setup.tenant, [spec], actor="test")[0]

    bounced = create(setup_a, "email", "Bounced@Example.com")
    complained = create(setup_b, "sms", "+15550001111")
    pushed = create(setup_a, "push", "tok_abcdef123456")
    with CaptureQueriesContext(connection) as ctx:
        created = suppress_notifications(
            {bounced.pk: "hard_bounce", complained.pk: "complaint", pushed.pk: "hard_bounce",
             "0190a0a0-0000-7000-8000-000000000000": "complaint"}  # fmt: skip
        )
    work = [q for q in ctx.captured_queries if "notifications" in q["sql"] or "suppressions" in q["sql"]]
    assert len(work) == 2, [q["sql"][:80] for q in ctx.captured_queries]
    found = sorted((c.tenant_id == setup_a.tenant.pk, c.channel, c.reason, c.source_notification_id) for c in created)
    assert found == sorted([(True, "email", "hard_bounce", bounced.pk), (False, "sms", "complaint", complained.pk)])
    assert [s.pk for s in suppressions.matching(setup_a.tenant.pk, "bounced@example.com")] == [
        c.pk for c in created if c.channel == "email"
    ]
    assert suppress_notifications({bounced.pk: "hard_bounce"}) == []  # idempotent
