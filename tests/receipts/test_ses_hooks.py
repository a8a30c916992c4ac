"""POST /hooks/providers/{id} for the ses kind, in process: what SNS is answered."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from receipts.models import NotificationEvent
from receipts.vendors import ses as adapter
from tests import factories
from tests.support.aws import SnsStandIn, ses_event

pytestmark = pytest.mark.django_db

CONFIG = {"region": "eu-west-1", "base_url": "http://127.0.0.1:9", "from_email": "alerts@example.com",
          "access_key_id": "AKIAIOSFODNN7EXAMPLE"}  # fmt: skip


@pytest.fixture
def sns(settings):
    with SnsStandIn() as standin:
        settings.OMNIPOST_SNS_CERT_URL_PATTERN = standin.cert_url_pattern
        adapter.CERTIFICATES.clear()
        yield standin
    adapter.CERTIFICATES.clear()


def post(provider_id: int, message: dict):  # noqa: ANN201
    client = Client(raise_request_exception=False)
    return client.post(f"/hooks/providers/{provider_id}", json.dumps(message), content_type="text/plain; charset=UTF-8",
                       HTTP_X_AMZ_SNS_MESSAGE_TYPE=message["Type"])  # fmt: skip


def test_a_failed_confirmation_is_not_acknowledged_so_sns_sends_it_again(tenant_a, sns):
    prov = factories.provider(tenant_a, "ses", kind="ses", channel="email", config=CONFIG,
                              secrets={"secret_access_key": "x" * 40})  # fmt: skip
    message = sns.subscription_confirmation(version="2")
    sns.confirm_status = 503
    assert post(prov.pk, message).status_code == 500
    sns.confirm_status = 200
    response = post(prov.pk, message)
    assert response.status_code == 200 and response.json() == {"received": 0}
    assert len(sns.confirmations) == 2


def test_bad_signature_is_401_and_a_valid_event_for_a_notification_is_applied(tenant_a, sns):
    prov = factories.provider(tenant_a, "ses", kind="ses", channel="email", config=CONFIG,
                              secrets={"secret_access_key": "x" * 40})  # fmt: skip
    (note,) = factories.notifications(tenant_a, prov, 1, recipient="jane.doe@example.com", status="delivered")
    message = sns.notification(ses_event("Complaint", str(note.pk)))
    forged = message | {"Message": json.dumps(ses_event("Complaint", str(uuid.uuid4())))}
    assert post(prov.pk, forged).status_code == 401
    assert not NotificationEvent.objects.exists()
    assert post(prov.pk, message).json() == {"received": 1}
    note.refresh_from_db()
    assert note.receipt == "complained"
    [event] = NotificationEvent.objects.all()
    assert event.type == "complained" and "jane.doe@example.com" not in json.dumps(event.details)
