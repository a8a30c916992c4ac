"""The SES adapter against an SNS stand-in that signs with a self-signed certificate served on loopback."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from receipts.inbound import ADAPTERS, Handled, InboundRequest, ProviderView, Rejected
from receipts.vendors import ses as adapter
from tests.support.aws import SnsStandIn, self_signed, ses_event

ADDRESS = "jane.doe@example.com"


@pytest.fixture
def sns(settings):
    with SnsStandIn() as standin:
        settings.OMNIPOST_SNS_CERT_URL_PATTERN = standin.cert_url_pattern
        settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = True
        adapter.CERTIFICATES.clear()
        yield standin
    adapter.CERTIFICATES.clear()


def provider(**config) -> ProviderView:
    base = {"region": "eu-west-1", "from_email": "alerts@example.com", "access_key_id": "AKIAIOSFODNN7EXAMPLE"}
    return ProviderView(id=7, tenant_id=str(uuid.uuid4()), kind="ses", config=base | config,
                        secrets={"secret_access_key": "x" * 40})  # fmt: skip


def post(message: dict, view: ProviderView | None = None, *, raw: bytes | None = None, headers=None):
    body = raw if raw is not None else json.dumps(message).encode()
    if headers is None:
        headers = {"x-amz-sns-message-type": message.get("Type", ""), "content-type": "text/plain; charset=UTF-8"}
    request = InboundRequest(url="https://notify.example.com/hooks/providers/7", headers=headers, body=body)
    return ADAPTERS["ses"](request, view or provider())


def cert_fetches(sns: SnsStandIn) -> int:
    return sum(1 for r in sns.requests if r.path == sns.CERT_PATH)


@pytest.mark.parametrize("version", ["1", "2"])
def test_signed_bounce_becomes_a_hard_bounce_receipt(sns, version):
    nid = str(uuid.uuid4())
    message = sns.notification(ses_event("Bounce", nid, ADDRESS), version=version)
    [receipt] = post(message)
    assert (receipt.notification_id, receipt.type, receipt.receipt, receipt.bounce_type) == (
        nid, "bounced", "bounced", "hard",
    )  # fmt: skip
    assert receipt.event_id == message["MessageId"] and receipt.dedup_key == f"id:{message['MessageId']}"
    assert receipt.occurred_at.tzinfo is not None
    assert abs(receipt.occurred_at - datetime.now(UTC)) < timedelta(minutes=1)
    assert receipt.details["bounce_type"] == "hard" and receipt.details["bounce_sub_type"] == "General"
    assert receipt.details["reporting_mta"] == "dsn; a8-70.smtp-out.amazonses.com"
    [rcpt] = receipt.details["recipients"]
    assert rcpt["email_address"] == "j***@example.com" and rcpt["status"] == "5.1.1"
    assert ADDRESS not in json.dumps(receipt.details)  # masked, also inside the diagnostic code
    assert "j***@example.com" in rcpt["diagnostic_code"]


@pytest.mark.parametrize(
    ("ses_type", "expected"), [("Permanent", "hard"), ("Transient", "soft"), ("Undetermined", "soft")]
)
def test_bounce_types(sns, ses_type, expected):
    [receipt] = post(sns.notification(ses_event("Bounce", str(uuid.uuid4()), bounce_type=ses_type)))
    assert (receipt.receipt, receipt.bounce_type) == ("bounced", expected)


def test_complaint_delivery_and_other_events(sns):
    nid = str(uuid.uuid4())
    [complaint] = post(sns.notification(ses_event("Complaint", nid), version="2"))
    assert (complaint.type, complaint.receipt, complaint.bounce_type) == ("complained", "complained", None)
    assert complaint.details["complaint_feedback_type"] == "abuse"
    assert complaint.details["recipients"] == [{"email_address": "j***@example.com"}]
    [delivery] = post(sns.notification(ses_event("Delivery", nid)))
    assert (delivery.type, delivery.receipt) == ("delivered", "delivered")
    assert delivery.details["processing_time_millis"] == 1234
    assert ADDRESS not in json.dumps(delivery.details)
    [delay] = post(sns.notification(ses_event("DeliveryDelay", nid)))
    assert (delay.type, delay.receipt, delay.notification_id) == ("delivery_delay", None, nid)
    [send] = post(sns.notification(ses_event("Send", nid)))
    assert (send.type, send.receipt) == ("send", None)
    assert len({complaint.event_id, delivery.event_id, delay.event_id, send.event_id}) == 4


def test_identity_notification_with_the_id_in_the_headers(sns):
    nid = str(uuid.uuid4())
    event = ses_event("Bounce", nid)
    event["notificationType"] = event.pop("eventType")
    del event["mail"]["tags"]
    event["mail"]["headers"] = [{"name": "X-OmniPost-Notification-Id", "value": nid}, {"name": "To", "value": ADDRESS}]
    [receipt] = post(sns.notification(event, subject="Amazon SES Email Event Notification"))
    assert (receipt.notification_id, receipt.receipt) == (nid, "bounced")


def test_a_verified_message_that_is_no_ses_event_carries_no_receipt(sns):
    assert post(sns.notification({"hello": "world"})) == []
    message = sns.notification({})
    assert post(sns.sign(message | {"Message": "plain text test"})) == []


def test_tampered_message_is_rejected(sns):
    message = sns.notification(ses_event("Delivery", str(uuid.uuid4())))
    other = json.loads(message["Message"]) | {"eventType": "Bounce"}
    with pytest.raises(Rejected, match="does not verify"):
        post(message | {"Message": json.dumps(other)})
    with pytest.raises(Rejected, match="does not verify"):
        post(message | {"Subject": "added after signing"})
    with pytest.raises(Rejected, match="does not verify"):
        post(message | {"SignatureVersion": "2"})  # a v1 signature presented as v2


def test_wrong_key_is_rejected(sns):
    other_key, _ = self_signed()
    message = sns.sign(sns.notification(ses_event("Bounce", str(uuid.uuid4()))), key=other_key)
    with pytest.raises(Rejected, match="does not verify"):
        post(message)
    sns.served_pem = self_signed()[1]  # the certificate URL now serves someone else's certificate
    adapter.CERTIFICATES.clear()
    with pytest.raises(Rejected, match="does not verify"):
        post(sns.notification(ses_event("Bounce", str(uuid.uuid4()))))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/cert.pem?x=.pem",
        "http://127.0.0.1:{port}/cert.txt",
        "https://127.0.0.1:{port}/cert.pem",
        "http://127.0.0.1:{port}/cert.pem#.pem",
        "http://127.0.0.2:{port}/cert.pem",
    ],
)
def test_cert_url_not_matching_the_pattern_is_rejected_without_a_fetch(sns, url):
    message = sns.notification(ses_event("Bounce", str(uuid.uuid4())))
    message["SigningCertURL"] = url.format(port=sns.port)
    with pytest.raises(Rejected, match="SigningCertURL"):
        post(message)
    assert sns.requests == []


def test_default_pattern_only_accepts_sns_over_https():
    from omnipost_site import settings as defaults

    pattern = defaults.OMNIPOST_SNS_CERT_URL_PATTERN
    assert re.fullmatch(pattern, "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-abc.pem")
    for url in (
        "http://sns.eu-west-1.amazonaws.com/x.pem",
        "https://sns.eu-west-1.amazonaws.com.evil.io/x.pem",
        "https://evil.io/sns.eu-west-1.amazonaws.com/x.pem",
        "https://sns.eu-west-1.amazonaws.com/x.pem?a",
    ):
        assert not re.fullmatch(pattern, url)


def test_unknown_signature_version_and_unsigned_messages_are_rejected(sns):
    message = sns.notification(ses_event("Bounce", str(uuid.uuid4())))
    with pytest.raises(Rejected, match="SignatureVersion"):
        post(message | {"SignatureVersion": "3"})
    with pytest.raises(Rejected, match="not signed"):
        post({k: v for k, v in message.items() if k != "Signature"})
    with pytest.raises(Rejected, match="base64"):
        post(message | {"Signature": "not base64!"})
    with pytest.raises(Rejected):
        post({}, raw=b"not json")
    with pytest.raises(Rejected, match="x-amz-sns-message-type"):
        post(message, headers={"x-amz-sns-message-type": "SubscriptionConfirmation"})


def test_certificate_is_fetched_once_and_cached(sns):
    for _ in range(3):
        post(sns.notification(ses_event("Delivery", str(uuid.uuid4()))))
    assert cert_fetches(sns) == 1


def test_cache_is_bounded_and_expires(monkeypatch):
    key = self_signed()[0].public_key()
    loads: list[str] = []
    monkeypatch.setattr(adapter, "_load_key", lambda url: loads.append(url) or key)
    cache = adapter._CertificateCache(size=2)
    for url in "abca":
        assert cache.public_key(url) is key
    assert loads == ["a", "b", "c", "a"]  # "a" was evicted by "c"
    assert list(cache._keys) == ["c", "a"]
    cache.public_key("c")
    assert len(loads) == 4
    expiring = adapter._CertificateCache(ttl=0)
    expiring.public_key("a")
    expiring.public_key("a")
    assert loads[-2:] == ["a", "a"]


def test_expired_certificate_is_rejected(sns):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.now(UTC)
    old = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(sns.key.public_key())
        .serial_number(1).not_valid_before(now - timedelta(days=60)).not_valid_after(now - timedelta(days=1))
        .sign(sns.key, hashes.SHA256())
    )  # fmt: skip
    sns.served_pem = old.public_bytes(serialization.Encoding.PEM)
    with pytest.raises(Rejected, match="not valid now"):
        post(sns.notification(ses_event("Bounce", str(uuid.uuid4()))))


def test_certificate_fetch_goes_through_the_ssrf_guard(sns, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    with pytest.raises(Rejected, match="could not be fetched"):
        post(sns.notification(ses_event("Bounce", str(uuid.uuid4()))))
    assert sns.requests == []


def test_topic_arn_is_enforced_when_configured(sns):
    message = sns.notification(ses_event("Bounce", str(uuid.uuid4())))
    assert post(message, provider(topic_arn=sns.topic_arn))
    with pytest.raises(Rejected, match="topic"):
        post(message, provider(topic_arn="arn:aws:sns:eu-west-1:123456789012:another"))


@pytest.mark.parametrize("version", ["1", "2"])
def test_subscription_confirmation_is_confirmed(sns, version):
    message = sns.subscription_confirmation(version=version)
    with pytest.raises(Handled):
        post(message)
    [confirmation] = sns.confirmations
    assert confirmation.method == "GET"
    assert confirmation.path == message["SubscribeURL"].removeprefix(sns.base_url)
    assert f"Token={message['Token']}" in confirmation.path


def test_forged_or_foreign_subscription_confirmations_are_not_followed(sns):
    message = sns.subscription_confirmation()
    with pytest.raises(Rejected, match="does not verify"):
        post(message | {"SubscribeURL": message["SubscribeURL"].replace("Token=", "Token=x")})
    elsewhere = f"http://localhost:{sns.port}/?Action=ConfirmSubscription&Token=abc"
    with pytest.raises(Rejected, match="SubscribeURL"):
        post(sns.subscription_confirmation(subscribe_url=elsewhere))
    assert sns.confirmations == []


def test_unsubscribe_confirmation_is_acknowledged(sns):
    message = sns.subscription_confirmation()
    message = sns.sign(message | {"Type": "UnsubscribeConfirmation"})
    with pytest.raises(Handled):
        post(message)
    assert sns.confirmations == []


def test_an_event_without_tags_or_headers_names_its_message_by_ses_message_id(sns):
    event = ses_event("Bounce", "")
    del event["mail"]["tags"]
    event["mail"]["messageId"] = "0102018c7f6a3b2e-1a2b3c4d-0000-000000"
    [receipt] = post(sns.notification(event))
    assert (receipt.notification_id, receipt.receipt) == ("", "bounced")
    assert receipt.provider_message_id == "0102018c7f6a3b2e-1a2b3c4d-0000-000000"  # looked up within the provider
    tagged = ses_event("Bounce", str(uuid.uuid4()))
    [receipt] = post(sns.notification(tagged))
    assert receipt.provider_message_id == ""  # the tag names it: the message id is not needed
