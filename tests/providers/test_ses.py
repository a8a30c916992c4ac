"""SES provider against a loopback SES v2 stand-in that recomputes every SigV4 signature with botocore."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from rest_framework.exceptions import ValidationError

from dlq.classifier import classify
from providers.kinds import REGISTRY, build_provider
from providers.kinds.base import OutboundMessage, provider_message_id
from providers.kinds.ses import SesProvider
from tests.support.aws import SesStandIn

KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REGION = "eu-west-1"


def message(recipient: str = "jane.doe@example.com") -> OutboundMessage:
    return OutboundMessage(
        str(uuid.uuid4()), str(uuid.uuid4()), "email", recipient, "Your receipt", "Thanks for your order", {},
        datetime.now(UTC), 1,
    )  # fmt: skip


def config(ses: SesStandIn, **changes) -> dict:
    return {"region": REGION, "base_url": ses.base_url, "from_email": "alerts@example.com", "access_key_id": KEY_ID} | (
        changes
    )


def send(ses: SesStandIn, msg: OutboundMessage | None = None, *, secret: str = SECRET, **changes):
    async def run():
        provider = build_provider("ses", config(ses, **changes), {"secret_access_key": secret})
        try:
            return await provider.send(msg or message())
        finally:
            await provider.aclose()

    return asyncio.run(run())


@pytest.fixture
def ses():
    with SesStandIn(access_key_id=KEY_ID, secret_access_key=SECRET, region=REGION) as standin:
        yield standin


def test_registered_kind():
    assert REGISTRY["ses"] is SesProvider


def test_send_email_signed_with_sigv4_and_tagged_with_the_notification_id(ses):
    msg = message()
    result = send(ses, msg)
    assert result.delivered and result.http_status == 200
    assert "SES message id 0102" in result.message
    assert result.provider_message_id == ses.message_ids[0]  # stored per provider by the dispatcher
    [req] = ses.requests
    assert req.verified, req.problem  # botocore recomputed the same signature in the stand-in
    assert (req.method, req.path) == ("POST", "/v2/email/outbound-emails")
    assert req.headers["content-type"] == "application/json"
    assert req.headers["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
    assert f"/{REGION}/ses/aws4_request" in req.headers["authorization"]
    assert SECRET not in str(req.headers)
    assert req.payload == {
        "FromEmailAddress": "alerts@example.com",
        "Destination": {"ToAddresses": ["jane.doe@example.com"]},
        "Content": {
            "Simple": {
                "Subject": {"Data": "Your receipt", "Charset": "UTF-8"},
                "Body": {"Text": {"Data": "Thanks for your order", "Charset": "UTF-8"}},
                "Headers": [{"Name": "X-OmniPost-Notification-Id", "Value": msg.notification_id}],
            }
        },
        "EmailTags": [{"Name": "notification_id", "Value": msg.notification_id}],
    }


def test_configuration_set_is_named_when_configured(ses):
    send(ses, configuration_set="omnipost-events")
    [req] = ses.requests
    assert req.verified and req.payload["ConfigurationSetName"] == "omnipost-events"


def test_unicode_content_signs_and_arrives(ses):
    msg = message()
    msg.subject, msg.body = "Reçu — ✓", "Grüße 👋"
    assert send(ses, msg).delivered
    [req] = ses.requests
    assert req.verified and req.payload["Content"]["Simple"]["Subject"]["Data"] == "Reçu — ✓"


def test_wrong_secret_is_refused_by_the_stand_in_and_permanent(ses):
    result = send(ses, secret="another-secret-key-0123456789abcdef")
    [req] = ses.requests
    assert req.verified is False and req.problem == "signature does not match"
    assert (result.delivered, result.http_status, result.error_code) == (False, 403, "ses_SignatureDoesNotMatch")
    assert classify(result).permanent
    assert "another-secret-key" not in result.message


def test_wrong_region_fails_the_signature_scope(ses):
    result = send(ses, region="us-east-1")
    [req] = ses.requests
    assert req.verified is False and "credential scope us-east-1/ses" in req.problem
    assert classify(result).permanent


@pytest.mark.parametrize(
    ("status", "error_type", "permanent", "code"),
    [
        (400, "MessageRejected", True, "ses_MessageRejected"),
        (400, "MailFromDomainNotVerifiedException", True, "ses_MailFromDomainNotVerifiedException"),
        (400, "BadRequestException", True, "ses_BadRequestException"),
        (429, "TooManyRequestsException", False, "ses_TooManyRequestsException"),
        (400, "LimitExceededException", False, "ses_LimitExceededException"),
        (500, "InternalFailure", False, "ses_InternalFailure"),
        (503, "", False, "http_503"),
    ],
)
def test_errors_are_classified(ses, status, error_type, permanent, code):
    ses.configure(
        status=status, error_type=error_type, error_message="Email address is not verified: jane.doe@example.com"
    )
    result = send(ses)
    assert (result.delivered, result.http_status, result.error_code) == (False, status, code)
    assert classify(result).permanent is permanent
    assert "jane.doe@example.com" not in result.message and "j***@example.com" in result.message


def test_retry_after_is_honoured(ses):
    ses.configure(status=429, error_type="TooManyRequestsException", retry_after="7")
    result = send(ses)
    assert result.retry_after == 7.0 and not classify(result).permanent


def test_redirect_is_permanent(ses):
    ses.configure(status=301)
    result = send(ses)
    assert (result.error_code, result.permanent) == ("redirect", True)


def test_invalid_recipient_is_not_sent(ses):
    result = send(ses, message("not-an-address"))
    assert (result.delivered, result.error_code, result.permanent) == (False, "invalid_recipient", True)
    assert ses.requests == []


def test_ssrf_guard_refuses_loopback_when_private_destinations_are_off(ses, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    result = send(ses)
    assert (result.delivered, result.error_code) == (False, "destination_forbidden")
    assert classify(result).permanent and ses.requests == []


def test_default_base_url_is_the_regional_endpoint():
    provider = SesProvider(
        {"region": "eu-west-1", "from_email": "a@example.com", "access_key_id": KEY_ID}, {"secret_access_key": SECRET}
    )
    assert provider.url == "https://email.eu-west-1.amazonaws.com/v2/email/outbound-emails"


def test_validate_normalises_and_rejects():
    good = {"region": "eu-west-1", "from_email": "a@example.com", "access_key_id": KEY_ID}
    out = SesProvider.validate(good, {"secret_access_key": SECRET}, check_destination=False)
    assert out == good | {"base_url": "https://email.eu-west-1.amazonaws.com"}
    for field, bad in [
        ("region", "Ireland"),
        ("from_email", "nobody"),
        ("access_key_id", "short"),
        ("base_url", "ftp://x"),
        ("topic_arn", "arn:nope"),
        ("color", "blue"),
    ]:
        with pytest.raises(ValidationError) as err:
            SesProvider.validate(good | {field: bad}, {"secret_access_key": SECRET}, check_destination=False)
        assert field in err.value.detail["config"]
    with pytest.raises(ValidationError) as err:
        SesProvider.validate(good, {}, check_destination=False)
    assert "secret_access_key" in err.value.detail["secrets"]


@pytest.mark.django_db
def test_api_accepts_ses_config_and_masks_the_secret(api_a):
    body = {
        "name": "ses-main",
        "channel": "email",
        "kind": "ses",
        "config": {"region": REGION, "from_email": "alerts@example.com", "access_key_id": KEY_ID,
                   "base_url": "http://127.0.0.1:9/", "topic_arn": "arn:aws:sns:eu-west-1:123456789012:ses-events"},
        "secrets": {"secret_access_key": SECRET},
    }  # fmt: skip
    response = api_a.post("/api/v1/providers", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["config"] == body["config"] | {"base_url": "http://127.0.0.1:9"}
    assert data["secrets"] == {"secret_access_key": "****" + SECRET[-4:]}
    assert SECRET not in response.content.decode()
    assert SECRET not in api_a.get("/api/v1/providers/ses-main").content.decode()
    sms = api_a.post("/api/v1/providers", body | {"name": "ses-sms", "channel": "sms"}, format="json")
    assert sms.status_code == 400 and "channel" in sms.json()["error"]["details"]


def test_botocore_is_imported_only_by_processes_that_build_an_ses_provider():
    import subprocess
    import sys

    code = (
        "import os, sys, django; os.environ['DJANGO_SETTINGS_MODULE'] = 'omnipost_site.settings_test'; django.setup();"
        "import providers.kinds, receipts.vendors; print('botocore' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.django_db
def test_admin_shows_an_ses_provider_with_its_secret_masked(tenant_a):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from tests import factories

    config = {"region": REGION, "from_email": "alerts@example.com", "access_key_id": KEY_ID,
              "base_url": "https://email.eu-west-1.amazonaws.com"}  # fmt: skip
    prov = factories.provider(tenant_a, "ses", kind="ses", channel="email", config=config,
                              secrets={"secret_access_key": SECRET})  # fmt: skip
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.test", "pw-unused-123"))
    for url in ("/admin/providers/provider/", f"/admin/providers/provider/{prov.pk}/change/"):
        page = client.get(url).content.decode()
        assert "ses" in page and SECRET not in page and SECRET[:20] not in page
    assert "****" + SECRET[-4:] in client.get(f"/admin/providers/provider/{prov.pk}/change/").content.decode()


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("0102018c7f6a3b2e-1a2b3c4d-0000-000000", "0102018c7f6a3b2e-1a2b3c4d-0000-000000"),
        ("<abc.def@example.com>", "<abc.def@example.com>"),
        (None, ""),
        (12345, ""),
        ("", ""),
        ("has space", ""),
        ("line\nbreak", ""),
        ("x" * 201, ""),
    ],
)
def test_a_providers_message_id_is_stored_only_when_it_is_a_bounded_printable_token(value, stored):
    assert provider_message_id(value) == stored
