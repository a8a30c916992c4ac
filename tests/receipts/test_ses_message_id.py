"""SES events that name the message only by `mail.messageId` (no configuration set's tags, no
"original headers"): the dispatcher stores the `MessageId` SES answered a send with, per provider,
and a validly signed SNS Bounce on that provider's events_url finds the notification by it, sets its
receipt and suppresses the address. The same message id posted to another provider of the same
tenant finds nothing and changes nothing (a message id is looked up within the provider that
receives the callback only)."""

from __future__ import annotations

import httpx
import pytest

from core.models import ApiKey
from notifications.models import Notification
from receipts.models import NotificationEvent
from tests import factories
from tests.receipts.event_support import deliver_events, suppressions
from tests.receipts.ses_support import ADDRESS, KEY_ID, REGION, SECRET, server, ses, sns, sns_post  # noqa: F401
from tests.support.aws import ses_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]



def untagged_bounce(message_id: str) -> dict:
    """A Permanent bounce as SES publishes it for an identity without a configuration set: no tags,
    no headers, the message named only by `mail.messageId`."""
    event = ses_event("Bounce", "", ADDRESS, bounce_type="Permanent")
    del event["mail"]["tags"]
    event["mail"]["messageId"] = message_id
    return event


def test_an_untagged_bounce_finds_its_notification_by_message_id_within_its_provider(
    server, ses, sns, tenant_a, subprocess_env, tmp_path  # noqa: F811 - the fixtures, imported
):
    config = {"region": REGION, "base_url": ses.base_url, "from_email": "alerts@example.com",
              "access_key_id": KEY_ID, "topic_arn": sns.topic_arn}  # fmt: skip
    prov = factories.provider(tenant_a, "ses", kind="ses", channel="email", config=config,
                              secrets={"secret_access_key": SECRET}, is_default=True)  # fmt: skip
    sibling = factories.provider(tenant_a, "ses-2", kind="ses", channel="email", config=config,
                                 secrets={"secret_access_key": SECRET})  # fmt: skip
    api = httpx.Client(base_url=f"{server}/api/v1", headers={"Authorization": f"Bearer {ApiKey.issue(tenant_a)[1]}"})
    created = api.post(
        "/notifications", json={"channel": "email", "recipient": ADDRESS, "subject": "Hi", "body": "Hello"}
    )
    assert created.status_code == 201, created.text
    note_id = created.json()["id"]
    deliver_events(subprocess_env, tmp_path)  # a real send, by a dispatcher process
    [message_id] = ses.message_ids
    assert api.get(f"/notifications/{note_id}").json()["status"] == "delivered"

    # Another provider of the same tenant, validly signed, naming that message id: nothing changes.
    foreign = sns.notification(untagged_bounce(message_id))
    answer = sns_post(f"{server}/hooks/providers/{sibling.pk}", foreign)
    assert answer.status_code == 200, answer.text
    assert Notification.objects.get(pk=note_id).receipt is None
    assert not NotificationEvent.objects.filter(notification_id=note_id).exists()
    assert suppressions(api, ADDRESS) == []

    # The provider that sent it: the bounce is its notification's, and the address is suppressed.
    bounce = sns.notification(untagged_bounce(message_id), version="2")
    assert sns_post(f"{server}/hooks/providers/{prov.pk}", bounce).json() == {"received": 1}
    detail = api.get(f"/notifications/{note_id}").json()
    assert (detail["receipt"], detail["bounce_type"]) == ("bounced", "hard")
    [event] = detail["events"]
    assert (event["type"], event["provider"], event["details"]["ses_message_id"]) == ("bounced", "ses", message_id)
    [entry] = suppressions(api, ADDRESS)
    assert (entry["reason"], entry["source_notification_id"]) == ("hard_bounce", note_id)

    # A message id SES never answered with finds nothing.
    stray = sns.notification(untagged_bounce("0102" + "0" * 32 + "-000000"))
    assert sns_post(f"{server}/hooks/providers/{prov.pk}", stray).status_code == 200
    assert NotificationEvent.objects.filter(notification_id=note_id).count() == 1
