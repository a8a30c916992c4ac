"""The dispatcher delivers through the SES provider to a loopback SES stand-in that checks SigV4."""

from __future__ import annotations

import pytest

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from notifications.models import DeliveryAttempt, Notification, ProviderMessage
from tests import factories
from tests.support.aws import SesStandIn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

KEY_ID, SECRET, REGION = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eu-west-1"
ADDRESS = "jane.doe@example.com"


@pytest.fixture
def ses():
    with SesStandIn(access_key_id=KEY_ID, secret_access_key=SECRET, region=REGION) as standin:
        yield standin


def ses_provider(tenant, ses: SesStandIn):  # noqa: ANN001, ANN201
    config = {"region": REGION, "base_url": ses.base_url, "from_email": "alerts@example.com", "access_key_id": KEY_ID}
    return factories.provider(tenant, "ses", kind="ses", channel="email", config=config,
                              secrets={"secret_access_key": SECRET})  # fmt: skip


def run_once() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


def test_queued_emails_are_delivered_signed_and_tagged(tenant_a, ses):
    notes = factories.queued(tenant_a, ses_provider(tenant_a, ses), 3, recipient=ADDRESS, subject="Hi", body="Body")
    run_once()
    assert {n.status for n in Notification.objects.all()} == {"delivered"}
    assert len(ses.accepted) == 3 == len(ses.requests)
    tags = {r.payload["EmailTags"][0]["Value"] for r in ses.accepted}
    assert tags == {str(n.id) for n in notes}
    assert {r.payload["Destination"]["ToAddresses"][0] for r in ses.accepted} == {ADDRESS}
    attempts = DeliveryAttempt.objects.all()
    assert [(a.outcome, a.http_status) for a in attempts] == [("delivered", 200)] * 3
    # SES's MessageId of each send, by provider: what an untagged SES event names the message by
    stored = {(m.provider_id, m.message_id): m.notification_id for m in ProviderMessage.objects.all()}
    by_id = {r.payload["EmailTags"][0]["Value"]: m for r, m in zip(ses.accepted, ses.message_ids, strict=True)}
    assert stored == {(notes[0].provider_id, by_id[str(n.id)]): n.id for n in notes}


def test_message_rejected_fails_and_throttling_retries(tenant_a, ses):
    prov = ses_provider(tenant_a, ses)
    ses.configure(status=400, error_type="MessageRejected", error_message=f"Email address is not verified: {ADDRESS}")
    (rejected,) = factories.queued(tenant_a, prov, 1, recipient=ADDRESS)
    run_once()
    rejected.refresh_from_db()
    attempt = DeliveryAttempt.objects.get(notification=rejected)
    assert (rejected.status, attempt.outcome, attempt.error_code) == (
        "failed",
        "permanent_error",
        "ses_MessageRejected",
    )
    ses.configure(status=429, error_type="TooManyRequestsException", retry_after="30")
    (throttled,) = factories.queued(tenant_a, prov, 1, recipient=ADDRESS)
    run_once()
    throttled.refresh_from_db()
    attempt = DeliveryAttempt.objects.get(notification=throttled)
    assert (throttled.status, attempt.outcome, attempt.http_status) == ("retrying", "transient_error", 429)
    assert SECRET not in str(list(DeliveryAttempt.objects.values()))
    assert not ProviderMessage.objects.exists()  # a send SES refused has no message id
