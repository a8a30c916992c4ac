"""Twilio and SendGrid end to end: a notification created through the API, sent by the dispatcher to
a loopback stand-in for the vendor's API, then the vendor's callback — signed as the vendor signs it
(`twilio.RequestValidator`; ECDSA that `sendgrid.EventWebhook` verifies) — posted to the provider's
`events_url`, and the notification's `receipt` and `events` read back through the API. Through real
processes, the tenant's event endpoint (verified with `standardwebhooks`) gets each outcome and receipt;
SendGrid's `bounce` and `spamreport` suppress the address, Twilio's `undelivered` does not."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from django.test import Client
from twilio.request_validator import RequestValidator

from core.models import ApiKey
from dispatch.dispatcher import Dispatcher, DispatcherConfig
from receipts.models import NotificationEvent
from tests.providers.test_sendgrid import API_KEY
from tests.providers.test_twilio import FROM, SID, TOKEN
from tests.queueing.dispatch_support import start_dispatchers, wait_exit
from tests.receipts.event_support import add_endpoint, deliver_events, suppressions
from tests.receipts.test_end_to_end import server  # noqa: F401  (gunicorn serving the API and the hooks)
from tests.receipts.test_sendgrid import Signer
from tests.support.receivers import HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

PUBLIC = "https://notify.example.com"
OTHER_TOKEN = "other-auth-token-fedcba9876543210"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture(autouse=True)
def public_url(settings):  # noqa: ANN001, ANN201
    settings.OMNIPOST_PUBLIC_URL = PUBLIC


def run_once() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


def create(api, body: dict) -> dict:  # noqa: ANN001
    response = api.post("/api/v1/notifications", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def detail(api, nid: str) -> dict:  # noqa: ANN001
    response = api.get(f"/api/v1/notifications/{nid}")
    assert response.status_code == 200
    return response.json()


def add_provider(api, body: dict) -> dict:  # noqa: ANN001
    response = api.post("/api/v1/providers", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


# --- Twilio -----------------------------------------------------------------------------------------


@pytest.fixture
def twilio_api():
    with HttpReceiver(status=201, body=b'{"sid": "SM0123456789abcdef0123456789abcdef", "status": "queued"}') as rx:
        yield rx


def twilio_provider(api, receiver: HttpReceiver, token: str = TOKEN) -> dict:  # noqa: ANN001
    config = {"account_sid": SID, "from_number": FROM, "base_url": f"http://127.0.0.1:{receiver.port}"}
    return add_provider(api, {"name": "sms", "channel": "sms", "kind": "twilio", "is_default": True,
                              "config": config, "secrets": {"auth_token": token}})  # fmt: skip


def twilio_post(callback_url: str, status: str, token: str = TOKEN, *, post_to: str | None = None, **extra: str):
    """The callback as Twilio posts it: form fields signed over `callback_url` with `token`."""
    sid = "SM" + "ab" * 16
    form = {"AccountSid": SID, "ApiVersion": "2010-04-01", "From": FROM, "To": "+15551234567", "MessageSid": sid,
            "SmsSid": sid, "MessageStatus": status, "SmsStatus": status, **extra}  # fmt: skip
    signature = RequestValidator(token).compute_signature(callback_url, form)
    parts = urlsplit(post_to or callback_url)
    target = f"{parts.path}?{parts.query}"
    return Client().post(target, urlencode(form), content_type=FORM, HTTP_X_TWILIO_SIGNATURE=signature)


def sent_callback(receiver: HttpReceiver, index: int = 0) -> str:
    [callback] = parse_qs(receiver.requests[index].body.decode())["StatusCallback"]
    return callback


def test_twilio_send_then_status_callbacks(api_a, twilio_api):
    provider = twilio_provider(api_a, twilio_api)
    note = create(api_a, {"channel": "sms", "recipient": "+15551234567", "body": "Your code is 123456"})
    run_once()
    assert detail(api_a, note["id"])["status"] == "delivered"
    callback = sent_callback(twilio_api)
    assert callback == f"{provider['events_url']}?n={note['id']}"

    assert twilio_post(callback, "sent").status_code == 200
    assert detail(api_a, note["id"])["receipt"] is None  # `sent` is no receipt, but an event
    assert twilio_post(callback, "undelivered", ErrorCode="30003").status_code == 200
    assert twilio_post(callback, "undelivered", ErrorCode="30003").status_code == 200  # Twilio retried: one event
    shown = detail(api_a, note["id"])
    assert shown["receipt"] == "undelivered"
    assert [e["type"] for e in shown["events"]] == ["sent", "undelivered"]
    assert shown["events"][1]["details"]["error_code"] == 30003
    assert "5551234567" not in json.dumps(shown["events"])


def test_twilio_callbacks_that_do_not_verify_are_401_and_change_nothing(api_a, twilio_api):
    provider = twilio_provider(api_a, twilio_api)
    note = create(api_a, {"channel": "sms", "recipient": "+15551234567", "body": "hi"})
    other = create(api_a, {"channel": "sms", "recipient": "+15551234567", "body": "hi"})
    run_once()
    callback = f"{provider['events_url']}?n={note['id']}"
    assert twilio_post(callback, "delivered", OTHER_TOKEN).status_code == 401  # another provider's token
    # Signed for one notification, posted naming another.
    assert twilio_post(callback, "delivered", post_to=callback.replace(note["id"], other["id"])).status_code == 401
    assert detail(api_a, note["id"])["receipt"] is None and detail(api_a, other["id"])["receipt"] is None
    assert not NotificationEvent.objects.exists()


def test_another_tenants_twilio_provider_cannot_touch_this_tenants_notification(api_a, api_b, twilio_api):
    twilio_provider(api_a, twilio_api)
    note = create(api_a, {"channel": "sms", "recipient": "+15551234567", "body": "hi"})
    run_once()
    b_provider = twilio_provider(api_b, twilio_api, token=OTHER_TOKEN)
    # Tenant B's own callback, validly signed for B's URL, naming tenant A's notification: 200, nothing changed.
    response = twilio_post(f"{b_provider['events_url']}?n={note['id']}", "undelivered", OTHER_TOKEN)
    assert response.status_code == 200
    assert detail(api_a, note["id"])["receipt"] is None
    assert not NotificationEvent.objects.exists()


# --- SendGrid ---------------------------------------------------------------------------------------


@pytest.fixture
def sendgrid_api():
    with HttpReceiver(status=202, body=b"", headers={"X-Message-Id": "W9yQ2v1dSmq3nuNqbkW8Ow"}) as rx:
        yield rx


def sendgrid_provider(api, receiver: HttpReceiver, signer: Signer) -> dict:  # noqa: ANN001
    config = {"base_url": f"http://127.0.0.1:{receiver.port}", "from_email": "alerts@example.com",
              "public_key": signer.public_key}  # fmt: skip
    return add_provider(api, {"name": "mail", "channel": "email", "kind": "sendgrid", "is_default": True,
                              "config": config, "secrets": {"api_key": API_KEY}})  # fmt: skip


def sendgrid_post(events_url: str, signer: Signer, events: list[dict], at: datetime | None = None):
    request = signer.request(events, at=at or datetime.now(UTC))
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in request.headers.items() if k != "Content-Type"}
    return Client().post(urlsplit(events_url).path, request.body, content_type="application/json", **extra)


def sg_event(name: str, nid: str, event_id: str, **extra: object) -> dict:
    return {"email": "jane.doe@example.com", "timestamp": int(time.time()), "event": name, "sg_event_id": event_id,
            "sg_message_id": "W9yQ2v1dSmq3nuNqbkW8Ow.filter0001", "notification_id": nid, **extra}  # fmt: skip


def test_sendgrid_send_then_event_webhook(api_a, sendgrid_api):
    signer = Signer()
    provider = sendgrid_provider(api_a, sendgrid_api, signer)
    note = create(api_a, {"channel": "email", "recipient": "jane.doe@example.com", "subject": "Hi", "body": "Hello"})
    run_once()
    assert detail(api_a, note["id"])["status"] == "delivered"
    nid = sendgrid_api.requests[0].payload["custom_args"]["notification_id"]
    assert nid == note["id"]
    bounce = sg_event("bounce", nid, "ev-2", type="bounce", status="5.1.1",
                      reason="550 5.1.1 <jane.doe@example.com> unknown")  # fmt: skip
    batch = [sg_event("processed", nid, "ev-1"), bounce]
    response = sendgrid_post(provider["events_url"], signer, batch)
    assert response.status_code == 200 and response.json() == {"received": 2}
    later = sendgrid_post(provider["events_url"], signer, [sg_event("delivered", nid, "ev-3")])
    assert later.status_code == 200  # a later `delivered` never hides the bounce
    assert sendgrid_post(provider["events_url"], signer, batch).status_code == 200  # SendGrid retried: nothing new
    shown = detail(api_a, note["id"])
    assert (shown["receipt"], shown["bounce_type"]) == ("bounced", "hard")
    assert sorted(e["type"] for e in shown["events"]) == ["bounced", "delivered", "processed"]
    assert "jane.doe@example.com" not in json.dumps(shown["events"])


def test_sendgrid_events_that_do_not_verify_are_401_and_change_nothing(api_a, sendgrid_api):
    signer = Signer()
    provider = sendgrid_provider(api_a, sendgrid_api, signer)
    note = create(api_a, {"channel": "email", "recipient": "jane.doe@example.com", "subject": "Hi", "body": "Hello"})
    run_once()
    events = [sg_event("spamreport", note["id"], "ev-9")]
    assert sendgrid_post(provider["events_url"], Signer(), events).status_code == 401  # another key
    stale = datetime.fromtimestamp(time.time() - 301, UTC)
    assert sendgrid_post(provider["events_url"], signer, events, at=stale).status_code == 401
    assert detail(api_a, note["id"])["receipt"] is None
    assert not NotificationEvent.objects.exists()


# --- both over real HTTP: gunicorn serves the API and the hooks, a run_dispatcher process sends -----


def test_twilio_and_sendgrid_receipts_through_real_processes(  # noqa: PLR0913, PLR0915
    server, subprocess_env, tenant_a, twilio_api, sendgrid_api, settings, event_receiver, tmp_path  # noqa: F811
):
    settings.OMNIPOST_PUBLIC_URL = server
    api = httpx.Client(base_url=f"{server}/api/v1", headers={"Authorization": f"Bearer {ApiKey.issue(tenant_a)[1]}"})
    signer = Signer()
    sms = api.post("/providers", json={
        "name": "sms", "channel": "sms", "kind": "twilio", "is_default": True, "secrets": {"auth_token": TOKEN},
        "config": {"account_sid": SID, "from_number": FROM, "base_url": f"http://127.0.0.1:{twilio_api.port}"}})
    mail = api.post("/providers", json={
        "name": "mail", "channel": "email", "kind": "sendgrid", "is_default": True, "secrets": {"api_key": API_KEY},
        "config": {"base_url": f"http://127.0.0.1:{sendgrid_api.port}", "from_email": "alerts@example.com",
                   "public_key": signer.public_key}})  # fmt: skip
    assert sms.status_code == mail.status_code == 201, (sms.text, mail.text)
    endpoint = add_endpoint(api, event_receiver)  # the tenant's own system, subscribed to every type
    text = api.post("/notifications", json={"channel": "sms", "recipient": "+15551234567", "body": "code 1"}).json()
    email = api.post("/notifications", json={"channel": "email", "recipient": "jane.doe@example.com",
                                             "subject": "Hi", "body": "Hello"}).json()  # fmt: skip
    lost_text = api.post("/notifications", json={"channel": "sms", "recipient": "+15557654321",
                                                 "body": "code 2"}).json()  # fmt: skip
    bounced_email = api.post("/notifications", json={"channel": "email", "recipient": "john.roe@example.com",
                                                     "subject": "Hi", "body": "Hello"}).json()  # fmt: skip

    env = {**subprocess_env, "OMNIPOST_PUBLIC_URL": server}
    [dispatcher] = start_dispatchers(1, env, "--once", "--no-listen")
    assert wait_exit([dispatcher], timeout=60) == [0]
    assert twilio_api.wait_for(2) and sendgrid_api.wait_for(2)
    callbacks = {sent_callback(twilio_api, i) for i in range(2)}
    assert callbacks == {f"{sms.json()['events_url']}?n={n['id']}" for n in (text, lost_text)}
    sent_ids = {r.payload["custom_args"]["notification_id"] for r in sendgrid_api.requests}
    assert sent_ids == {email["id"], bounced_email["id"]}
    # The sends' outcomes reached the tenant's endpoint (the --once dispatcher delivers its events before it exits).
    accepted = endpoint.of_type("notification.delivered")
    assert sorted(e["data"]["notification_id"] for e in accepted) == sorted(
        n["id"] for n in (text, email, lost_text, bounced_email))  # fmt: skip

    # Twilio posts its callback to the StatusCallback the send handed it, signed over that URL.
    callback = f"{sms.json()['events_url']}?n={text['id']}"
    sid = "SM" + "cd" * 16
    form = {"AccountSid": SID, "MessageSid": sid, "MessageStatus": "delivered", "SmsSid": sid, "SmsStatus": "delivered",
            "To": "+15551234567", "From": FROM, "ApiVersion": "2010-04-01"}  # fmt: skip
    signature = RequestValidator(TOKEN).compute_signature(callback, form)
    answer = httpx.post(callback, data=form, headers={"X-Twilio-Signature": signature})
    assert answer.status_code == 200 and answer.json() == {"received": 1}
    forged = httpx.post(callback, data={**form, "MessageStatus": "failed"}, headers={"X-Twilio-Signature": signature})
    assert forged.status_code == 401

    # The other message never reached its handset: `undelivered` (no suppression on SMS).
    lost_callback = f"{sms.json()['events_url']}?n={lost_text['id']}"
    lost_form = {**form, "MessageSid": "SM" + "ef" * 16, "SmsSid": "SM" + "ef" * 16, "To": "+15557654321",
                 "MessageStatus": "undelivered", "SmsStatus": "undelivered", "ErrorCode": "30003"}  # fmt: skip
    signature = RequestValidator(TOKEN).compute_signature(lost_callback, lost_form)
    answer = httpx.post(lost_callback, data=lost_form, headers={"X-Twilio-Signature": signature})
    assert answer.status_code == 200 and answer.json() == {"received": 1}

    # SendGrid posts a signed batch naming the notifications by their custom arg: a spam report about
    # one, a bounce of the other.
    nid = email["id"]
    batch = [sg_event("delivered", nid, "ev-d"), sg_event("spamreport", nid, "ev-s"),
             sg_event("bounce", bounced_email["id"], "ev-x", email="john.roe@example.com", type="bounce",
                      status="5.1.1", reason="550 5.1.1 <john.roe@example.com> unknown")]  # fmt: skip
    request = signer.request(batch, at=datetime.now(UTC))
    answer = httpx.post(mail.json()["events_url"], content=request.body, headers=dict(request.headers))
    assert answer.status_code == 200 and answer.json() == {"received": 3}
    six_minutes_ago = datetime.now(UTC) - timedelta(minutes=6)
    stale = signer.request([sg_event("bounce", nid, "ev-b", type="bounce")], at=six_minutes_ago)
    assert httpx.post(mail.json()["events_url"], content=stale.body, headers=dict(stale.headers)).status_code == 401

    shown_text = api.get(f"/notifications/{text['id']}").json()
    assert (shown_text["status"], shown_text["receipt"]) == ("delivered", "delivered")
    assert [(e["type"], e["provider"]) for e in shown_text["events"]] == [("delivered", "sms")]
    shown_email = api.get(f"/notifications/{email['id']}").json()
    assert (shown_email["status"], shown_email["receipt"]) == ("delivered", "complained")
    assert sorted(e["type"] for e in shown_email["events"]) == ["complained", "delivered"]
    assert [n["id"] for n in api.get("/notifications", params={"receipt": "complained"}).json()["results"]] == [
        email["id"]
    ]
    assert api.get(f"/notifications/{lost_text['id']}").json()["receipt"] == "undelivered"
    shown_bounce = api.get(f"/notifications/{bounced_email['id']}").json()
    assert (shown_bounce["receipt"], shown_bounce["bounce_type"]) == ("bounced", "hard")

    # The spam report and the bounce suppress their addresses; Twilio's `undelivered` suppresses nothing.
    [complaint_entry] = suppressions(api, "jane.doe@example.com")
    [bounce_entry] = suppressions(api, "john.roe@example.com")
    assert (complaint_entry["reason"], complaint_entry["channel"], complaint_entry["source_notification_id"]) == (
        "complaint", "email", email["id"])  # fmt: skip
    assert (bounce_entry["reason"], bounce_entry["source_notification_id"]) == ("hard_bounce", bounced_email["id"])
    assert suppressions(api, "+15557654321") == [] and suppressions(api, "+15551234567") == []
    # The next email to a suppressed address is stored `suppressed`; a text to the number that was
    # `undelivered` still goes.
    blocked = api.post("/notifications", json={"channel": "email", "recipient": "jane.doe@example.com",
                                               "subject": "Again", "body": "Hello"})  # fmt: skip
    assert blocked.status_code == 201 and blocked.json()["status"] == "suppressed", blocked.text
    retry_text = api.post("/notifications", json={"channel": "sms", "recipient": "+15557654321", "body": "code 3"})
    assert retry_text.status_code == 201 and retry_text.json()["status"] != "suppressed"

    # One more dispatcher process: sends the text, delivers the receipts' events to the tenant's endpoint.
    deliver_events(env, tmp_path)
    assert len(twilio_api.requests) == 3 and len(sendgrid_api.requests) == 2
    assert api.get(f"/notifications/{blocked.json()['id']}").json()["status"] == "suppressed"
    failed = endpoint.of_type("notification.failed")
    assert [(e["data"]["notification_id"], e["data"]["receipt"], e["data"]["channel"]) for e in failed] == [
        (lost_text["id"], "undelivered", "sms")]  # fmt: skip
    assert failed[0]["data"]["status"] == "delivered"  # the provider accepted it; the handset never got it
    [complained] = endpoint.of_type("notification.complained")
    assert (complained["data"]["notification_id"], complained["data"]["receipt"]) == (email["id"], "complained")
    [bounced] = endpoint.of_type("notification.bounced")
    assert {k: bounced["data"][k] for k in ("notification_id", "receipt", "bounce_type", "provider")} == {
        "notification_id": bounced_email["id"], "receipt": "bounced", "bounce_type": "hard", "provider": "mail"}
    assert bounced["data"]["recipient_masked"] == shown_bounce["recipient_masked"]
    suppressed = {e["data"]["reason"]: e["data"] for e in endpoint.of_type("recipient.suppressed")}
    assert suppressed == {
        "complaint": {"suppression_id": complaint_entry["id"], "recipient_masked": complaint_entry["recipient_masked"],
                      "channel": "email", "reason": "complaint", "category": None,
                      "source_notification_id": email["id"]},
        "hard_bounce": {"suppression_id": bounce_entry["id"], "recipient_masked": bounce_entry["recipient_masked"],
                        "channel": "email", "reason": "hard_bounce", "category": None,
                        "source_notification_id": bounced_email["id"]},
    }  # fmt: skip
    assert len(endpoint.of_type("notification.delivered")) == 5  # the retried text too
    bodies = endpoint.bodies()
    assert all(a not in bodies for a in ("jane.doe@example.com", "john.roe@example.com", "+15557654321"))
