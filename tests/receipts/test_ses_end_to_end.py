"""The ses kind end to end over real HTTP: the API (a gunicorn process) creates an email, the dispatcher
sends it to the SES stand-in (SigV4 checked), and SNS-signed SES events posted to the provider's
events_url become the notification's receipt and events; the SNS subscription is confirmed first.
The tenant's event endpoint (verified with `standardwebhooks`) gets each outcome and receipt; a
Permanent bounce and a Complaint each suppress their address, and the next email to it is never sent."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from core.models import ApiKey
from notifications.models import Notification
from receipts.models import NotificationEvent
from tests import factories
from tests.receipts.event_support import add_endpoint, deliver_events, suppressions
from tests.receipts.ses_support import ADDRESS, KEY_ID, REGION, SECRET, server, ses, sns, sns_post  # noqa: F401
from tests.support.aws import self_signed, ses_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

COMPLAINER = "john.roe@example.com"


def test_ses_receipts_end_to_end(server, ses, sns, tenant_a, tenant_b, event_receiver, subprocess_env, tmp_path):  # noqa: F811, PLR0913, PLR0915
    config = {"region": REGION, "base_url": ses.base_url, "from_email": "alerts@example.com",
              "access_key_id": KEY_ID, "topic_arn": sns.topic_arn}  # fmt: skip
    prov = factories.provider(tenant_a, "ses", kind="ses", channel="email", config=config,
                              secrets={"secret_access_key": SECRET}, is_default=True)  # fmt: skip
    other = factories.provider(tenant_b, "ses", kind="ses", channel="email", config=config,
                               secrets={"secret_access_key": SECRET})  # fmt: skip
    theirs = factories.notifications(tenant_b, other, 1, recipient=ADDRESS, status="delivered")[0]
    api = httpx.Client(base_url=f"{server}/api/v1", headers={"Authorization": f"Bearer {ApiKey.issue(tenant_a)[1]}"})
    shown = api.get("/providers/ses").json()
    assert shown["kind"] == "ses" and shown["secrets"] == {"secret_access_key": "****" + SECRET[-4:]}
    events_url = shown["events_url"]
    assert events_url == f"{server}/hooks/providers/{prov.pk}"
    endpoint = add_endpoint(api, event_receiver)  # the tenant's own system, subscribed to every type

    # SNS asks to confirm the subscription: OmniPost GETs the SubscribeURL (through the SSRF guard).
    confirmation = sns.subscription_confirmation()
    answer = sns_post(events_url, confirmation)
    assert answer.status_code == 200, answer.text
    [confirmed] = sns.confirmations
    assert f"Token={confirmation['Token']}" in confirmed.path

    # A real send by a dispatcher process, SigV4-verified by the stand-in, tagged with the notification id.
    created = api.post(
        "/notifications", json={"channel": "email", "recipient": ADDRESS, "subject": "Hi", "body": "Hello"}
    )
    assert created.status_code == 201, created.text
    note_id = created.json()["id"]
    deliver_events(subprocess_env, tmp_path)
    [sent] = ses.accepted
    tag = {t["Name"]: t["Value"] for t in sent.payload["EmailTags"]}["notification_id"]
    assert tag == note_id and api.get(f"/notifications/{note_id}").json()["status"] == "delivered"

    # SES publishes Delivery, then a hard Bounce, through SNS (signature v2, then v1).
    delivery = sns.notification(ses_event("Delivery", tag, ADDRESS), version="2")
    assert sns_post(events_url, delivery).json() == {"received": 1}
    detail = api.get(f"/notifications/{note_id}").json()
    assert (detail["receipt"], detail["bounce_type"]) == ("delivered", None)
    [event] = detail["events"]
    assert (event["type"], event["provider"]) == ("delivered", "ses")
    assert event["details"]["processing_time_millis"] == 1234
    bounce = sns.notification(ses_event("Bounce", tag, ADDRESS, bounce_type="Permanent"), version="1")
    assert sns_post(events_url, bounce).json() == {"received": 1}
    assert sns_post(events_url, bounce).status_code == 200  # SNS retries: the same MessageId, one event
    late_delivery = sns.notification(ses_event("Delivery", tag, ADDRESS))
    assert sns_post(events_url, late_delivery).status_code == 200
    detail = api.get(f"/notifications/{note_id}").json()
    assert (detail["status"], detail["receipt"], detail["bounce_type"]) == ("delivered", "bounced", "hard")
    assert sorted(e["type"] for e in detail["events"]) == ["bounced", "delivered", "delivered"]
    assert ADDRESS not in json.dumps(detail) and ADDRESS not in str(list(NotificationEvent.objects.values()))
    cert_gets = [r for r in sns.requests if r.path == sns.CERT_PATH]
    assert len(cert_gets) == 1  # fetched once, then cached by the web process

    # What does not verify: 401, nothing changed.
    before = NotificationEvent.objects.count()
    complaint = sns.notification(ses_event("Complaint", tag, ADDRESS))
    tampered = complaint | {"Message": complaint["Message"].replace("abuse", "not-spam")}
    foreign_cert = complaint | {"SigningCertURL": "https://example.com/cert.pem"}
    other_key = sns.sign(dict(complaint), key=self_signed()[0])
    other_topic = sns.notification(ses_event("Complaint", tag), TopicArn="arn:aws:sns:eu-west-1:999999999999:x")
    for case, message in {"tampered": tampered, "cert URL": foreign_cert, "wrong key": other_key,
                          "other topic": other_topic}.items():  # fmt: skip
        response = sns_post(events_url, message)
        assert response.status_code == 401, (case, response.text)
    assert NotificationEvent.objects.count() == before
    assert Notification.objects.get(pk=note_id).receipt == "bounced"

    # Another tenant's notification, validly signed, on this provider's URL: 200, nothing changed.
    foreign = sns.notification(ses_event("Complaint", str(theirs.pk), ADDRESS))
    assert sns_post(events_url, foreign).json() == {"received": 1}
    theirs.refresh_from_db()
    assert theirs.receipt is None and not NotificationEvent.objects.filter(notification=theirs).exists()
    unknown = sns.notification(ses_event("Complaint", str(uuid.uuid4()), ADDRESS))
    assert sns_post(events_url, unknown).status_code == 200
    assert NotificationEvent.objects.count() == before

    # A Complaint about a second message suppresses its address too.
    second = api.post("/notifications", json={"channel": "email", "recipient": COMPLAINER, "subject": "Hi",
                                              "body": "Hello"}).json()  # fmt: skip
    deliver_events(subprocess_env, tmp_path)
    assert len(ses.accepted) == 2
    tag2 = {t["Name"]: t["Value"] for t in ses.accepted[1].payload["EmailTags"]}["notification_id"]
    assert tag2 == second["id"]
    assert sns_post(events_url, sns.notification(ses_event("Complaint", tag2, COMPLAINER))).json() == {"received": 1}
    assert (api.get(f"/notifications/{tag2}").json()["receipt"]) == "complained"
    [bounced_entry] = suppressions(api, ADDRESS.upper())  # addresses match case-insensitively
    [complained_entry] = suppressions(api, COMPLAINER)
    assert (bounced_entry["reason"], bounced_entry["channel"], bounced_entry["source_notification_id"]) == (
        "hard_bounce", "email", note_id)  # fmt: skip
    assert (complained_entry["reason"], complained_entry["source_notification_id"]) == ("complaint", tag2)

    # The next email to a suppressed address is stored `suppressed` and never sent.
    blocked = api.post("/notifications", json={"channel": "email", "recipient": ADDRESS, "subject": "Again",
                                               "body": "Hello"})  # fmt: skip
    assert blocked.status_code == 201 and blocked.json()["status"] == "suppressed", blocked.text

    # One more dispatcher process delivers the events to the tenant's endpoint; nothing else goes to SES.
    deliver_events(subprocess_env, tmp_path)
    assert len(ses.accepted) == 2
    assert api.get(f"/notifications/{blocked.json()['id']}").json()["status"] == "suppressed"
    events = endpoint.events()
    assert sorted(e["type"] for e in events) == sorted([
        "notification.delivered", "notification.delivered", "notification.bounced", "notification.complained",
        "recipient.suppressed", "recipient.suppressed"])  # fmt: skip
    assert len({e["webhook_id"] for e in events}) == len(events)
    [bounced] = endpoint.of_type("notification.bounced")  # SNS's retry and the late Delivery: no more
    assert {k: bounced["data"][k] for k in ("notification_id", "receipt", "bounce_type", "channel", "provider")} == {
        "notification_id": note_id, "receipt": "bounced", "bounce_type": "hard", "channel": "email",
        "provider": "ses"}  # fmt: skip
    assert bounced["data"]["recipient_masked"] == detail["recipient_masked"]
    [complained] = endpoint.of_type("notification.complained")
    assert (complained["data"]["notification_id"], complained["data"]["receipt"]) == (tag2, "complained")
    assert complained["data"]["bounce_type"] is None
    suppressed = {e["data"]["reason"]: e["data"] for e in endpoint.of_type("recipient.suppressed")}
    assert suppressed == {
        "hard_bounce": {"suppression_id": bounced_entry["id"], "recipient_masked": bounced_entry["recipient_masked"],
                        "channel": "email", "reason": "hard_bounce", "category": None,
                        "source_notification_id": note_id},
        "complaint": {"suppression_id": complained_entry["id"], "channel": "email", "reason": "complaint",
                      "recipient_masked": complained_entry["recipient_masked"], "category": None,
                      "source_notification_id": tag2},
    }  # fmt: skip
    assert ADDRESS not in endpoint.bodies() and COMPLAINER not in endpoint.bodies()
