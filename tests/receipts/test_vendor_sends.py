"""What the dispatcher sends hands the vendor a way back: Twilio's StatusCallback names the provider's
events URL and the notification; SendGrid's custom_args name the notification. The in-process
dispatcher against loopback stand-ins for the vendors' APIs."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.models import DeliveryAttempt, Notification
from tests import factories
from tests.providers.test_sendgrid import API_KEY, PUBLIC_KEY
from tests.providers.test_twilio import FROM, SID, TOKEN
from tests.support.receivers import HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

PUBLIC = "https://notify.example.com"


def run_once() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


@pytest.fixture
def public_url(settings):  # noqa: ANN001, ANN201
    settings.OMNIPOST_PUBLIC_URL = PUBLIC
    return PUBLIC


def test_twilio_sends_carry_a_status_callback_per_notification(tenant_a, public_url):
    with HttpReceiver(status=201, body=b'{"sid": "SM0123456789abcdef0123456789abcdef", "status": "queued"}') as api:
        sms = factories.provider(
            tenant_a, "sms", kind="twilio", channel="sms", secrets={"auth_token": TOKEN},
            config={"account_sid": SID, "from_number": FROM, "base_url": f"http://127.0.0.1:{api.port}"},
        )  # fmt: skip
        notes = factories.queued(tenant_a, sms, 3, recipient="+15551234567", body="Your code is 123456")
        run_once()
        assert api.wait_for(3)
        callbacks = sorted(parse_qs(r.body.decode())["StatusCallback"][0] for r in api.requests)
    assert callbacks == sorted(f"{PUBLIC}/hooks/providers/{sms.pk}?n={n.id}" for n in notes)
    assert set(Notification.objects.values_list("status", flat=True)) == {"delivered"}


def test_sendgrid_sends_name_the_notification_in_custom_args(tenant_a, public_url):
    with HttpReceiver(status=202, body=b"", headers={"X-Message-Id": "W9yQ2v1dSmq3nuNqbkW8Ow"}) as api:
        mail = factories.provider(
            tenant_a, "mail", kind="sendgrid", channel="email", secrets={"api_key": API_KEY},
            config={"base_url": f"http://127.0.0.1:{api.port}", "from_email": "alerts@example.com",
                    "public_key": PUBLIC_KEY},
        )  # fmt: skip
        [note] = factories.queued(tenant_a, mail, 1, recipient="jane.doe@example.com", subject="Hi", body="Hello")
        run_once()
        assert api.wait_for(1)
        [request] = api.requests
    assert request.path == "/v3/mail/send" and request.headers["authorization"] == f"Bearer {API_KEY}"
    assert request.payload["custom_args"] == {"notification_id": str(note.id)}
    assert request.payload["personalizations"] == [{"to": [{"email": "jane.doe@example.com"}]}]
    note.refresh_from_db()
    assert note.status == "delivered"
    [attempt] = DeliveryAttempt.objects.filter(notification=note)
    assert (attempt.outcome, attempt.http_status) == ("delivered", 202)
