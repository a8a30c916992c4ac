"""SendGrid's signed Event Webhook, parsed by receipts.vendors.sendgrid.

Events are signed here with `cryptography` (ECDSA P-256 / SHA-256 over timestamp + body, DER,
base64), and every signature this file makes is also checked with the `sendgrid` package's own
`EventWebhook.verify_signature`, which proves the format is the vendor's. SendGrid's published
sample (key, signature and payload from the sendgrid package's tests) is accepted as well.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sendgrid import EventWebhook

from receipts.inbound import ADAPTERS, InboundRequest, ProviderView, Rejected
from receipts.vendors import sendgrid as sendgrid_adapter

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SIGNATURE = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP = "X-Twilio-Email-Event-Webhook-Timestamp"

# SendGrid's own sample, as published with its library (sendgrid/test/unit/test_eventwebhook.py).
SAMPLE_KEY = (
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpV"
    "KS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g=="
)
SAMPLE_SIGNATURE = "MEUCIGHQVtGj+Y3LkG9fLcxf3qfI10QysgDWmMOVmxG0u6ZUAiEAyBiXDWzM+uOe5W0JuG+luQAbPIqHh89M15TluLtEZtM="
SAMPLE_TIMESTAMP = "1600112502"
SAMPLE_PAYLOAD = (
    json.dumps(
        [
            {
                "email": "hello@world.com",
                "event": "dropped",
                "reason": "Bounced Address",
                "sg_event_id": "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
                "sg_message_id": "LRzXl_NHStOGhQ4kofSm_A.filterdrecv-p3mdw1-756b745b58-kmzbl-18-5F5FC76C-9.0",
                "smtp-id": "<LRzXl_NHStOGhQ4kofSm_A@ismtpd0039p1iad1.sendgrid.net>",
                "timestamp": 1600112492,
            }
        ],
        sort_keys=True,
        separators=(",", ":"),
    )
    + "\r\n"
)


class Signer:
    """What SendGrid holds: a P-256 private key; `public_key` is the text its console shows."""

    def __init__(self) -> None:
        self.private = ec.generate_private_key(ec.SECP256R1())
        der = self.private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.public_key = base64.b64encode(der).decode()

    def request(self, events: list[dict], *, at: datetime = NOW, body: bytes | None = None) -> InboundRequest:
        payload = body if body is not None else json.dumps(events).encode()
        timestamp = str(int(at.timestamp()))
        signature = base64.b64encode(
            self.private.sign(timestamp.encode() + payload, ec.ECDSA(hashes.SHA256()))
        ).decode()
        # The vendor's verifier must accept what this signer makes.
        assert EventWebhook(self.public_key).verify_signature(payload.decode(), signature, timestamp)
        return InboundRequest(
            url="https://notify.example.com/hooks/providers/3",
            headers={SIGNATURE: signature, TIMESTAMP: timestamp, "Content-Type": "application/json"},
            body=payload,
        )


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer()


def view(public_key: str) -> ProviderView:
    return ProviderView(
        id=3,
        tenant_id=str(uuid.uuid4()),
        kind="sendgrid",
        config={"base_url": "https://api.sendgrid.com", "from_email": "alerts@example.com", "public_key": public_key},
        secrets={"api_key": "SG.test-key.0123456789"},
    )


def parse(request: InboundRequest, provider: ProviderView, now: datetime = NOW):
    return sendgrid_adapter.parse(request, provider, now=lambda: now)


def event(name: str, nid: str, **extra: object) -> dict:
    return {
        "email": "jane.doe@example.com",
        "timestamp": int(NOW.timestamp()) - 30,
        "event": name,
        "sg_event_id": f"ev-{name}-{uuid.uuid4().hex[:8]}",
        "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
        "notification_id": nid,
        **extra,
    }


def test_registered_for_the_sendgrid_kind():
    assert ADAPTERS["sendgrid"] is sendgrid_adapter.parse


def test_sendgrids_published_sample_is_accepted():
    at = datetime.fromtimestamp(int(SAMPLE_TIMESTAMP) + 10, UTC)
    request = InboundRequest(
        url="https://notify.example.com/hooks/providers/3",
        headers={SIGNATURE: SAMPLE_SIGNATURE, TIMESTAMP: SAMPLE_TIMESTAMP},
        body=SAMPLE_PAYLOAD.encode(),
    )
    [r] = parse(request, view(SAMPLE_KEY), now=at)
    assert (r.type, r.receipt, r.event_id) == (
        "dropped",
        "failed",
        "ZHJvcC0xMDk5NDkxOS1MUnpYbF9OSFN0T0doUTRrb2ZTbV9BLTA",
    )
    assert r.notification_id == ""  # the sample was not sent by OmniPost: an unknown notification
    assert r.occurred_at == datetime.fromtimestamp(1600112492, UTC)
    tampered = InboundRequest(request.url, request.headers, SAMPLE_PAYLOAD.replace("dropped", "delivered").encode())
    with pytest.raises(Rejected):
        parse(tampered, view(SAMPLE_KEY), now=at)


@pytest.mark.parametrize(
    ("name", "extra", "shown", "receipt", "bounce_type"),
    [
        ("delivered", {"response": "250 OK"}, "delivered", "delivered", None),
        (
            "bounce",
            {"type": "bounce", "status": "5.1.1", "reason": "550 5.1.1 no such user"},
            "bounced",
            "bounced",
            "hard",
        ),
        ("bounce", {"type": "blocked", "status": "4.0.0", "reason": "IP blocklisted"}, "bounced", "bounced", "soft"),
        ("dropped", {"reason": "Bounced Address"}, "dropped", "failed", None),
        ("spamreport", {}, "complained", "complained", None),
        ("deferred", {"attempt": "2", "response": "400 try again later"}, "deferred", None, None),
        ("processed", {}, "processed", None, None),
        ("open", {"useragent": "Mozilla/5.0"}, "open", None, None),
    ],
)
def test_event_maps_to_receipt(signer, name, extra, shown, receipt, bounce_type):
    nid = str(uuid.uuid4())
    raw = event(name, nid, **extra)
    [r] = parse(signer.request([raw]), view(signer.public_key))
    assert (r.notification_id, r.type, r.receipt, r.bounce_type) == (nid, shown, receipt, bounce_type)
    assert r.event_id == raw["sg_event_id"] and r.dedup_key == f"id:{raw['sg_event_id']}"
    assert r.occurred_at == NOW - timedelta(seconds=30)
    assert r.details["sg_message_id"] == raw["sg_message_id"]
    assert "jane.doe@example.com" not in json.dumps(r.details)


def test_a_batch_gives_one_receipt_per_event_in_order(signer):
    nid = str(uuid.uuid4())
    events = [event("processed", nid), event("delivered", nid), event("spamreport", nid)]
    receipts = parse(signer.request(events), view(signer.public_key))
    assert [r.receipt for r in receipts] == [None, "delivered", "complained"]
    assert {r.notification_id for r in receipts} == {nid}


def test_addresses_in_free_text_are_masked(signer):
    raw = event("bounce", str(uuid.uuid4()), type="bounce", reason="550 5.1.1 <jane.doe@example.com>: unknown user")
    [r] = parse(signer.request([raw]), view(signer.public_key))
    assert r.details["reason"] == "550 5.1.1 <j***@example.com>: unknown user"


def test_an_event_without_sg_event_id_is_deduplicated_by_its_hash(signer):
    raw = event("delivered", str(uuid.uuid4()))
    del raw["sg_event_id"]
    first = parse(signer.request([raw]), view(signer.public_key))[0]
    again = parse(signer.request([dict(reversed(list(raw.items())))]), view(signer.public_key))[0]
    assert first.event_id == "" and first.dedup_key.startswith("sha256:")
    assert first.dedup_key == again.dedup_key  # key order does not make it another event


def test_bad_signature_is_rejected(signer):
    request = signer.request([event("delivered", str(uuid.uuid4()))])
    other = Signer().request([event("delivered", str(uuid.uuid4()))])
    forged = InboundRequest(request.url, {**request.headers, SIGNATURE: other.headers[SIGNATURE]}, request.body)
    with pytest.raises(Rejected):
        parse(forged, view(signer.public_key))
    for broken in ("not base64!", "", base64.b64encode(b"\x30\x02\x00\x00").decode()):
        with pytest.raises(Rejected):
            parse(
                InboundRequest(request.url, {**request.headers, SIGNATURE: broken}, request.body),
                view(signer.public_key),
            )


def test_altered_body_or_timestamp_is_rejected(signer):
    nid = str(uuid.uuid4())
    request = signer.request([event("bounce", nid, type="bounce")])
    body = request.body.replace(b'"bounce"', b'"delivered"', 1)
    with pytest.raises(Rejected):
        parse(InboundRequest(request.url, request.headers, body), view(signer.public_key))
    moved = str(int(request.headers[TIMESTAMP]) + 1)
    with pytest.raises(Rejected):
        parse(InboundRequest(request.url, {**request.headers, TIMESTAMP: moved}, request.body), view(signer.public_key))


def test_another_providers_key_is_rejected(signer):
    other = Signer()
    request = other.request([event("delivered", str(uuid.uuid4()))])
    with pytest.raises(Rejected):
        parse(request, view(signer.public_key))
    assert parse(request, view(other.public_key))


def test_stale_or_future_timestamp_is_rejected(signer):
    request = signer.request([event("delivered", str(uuid.uuid4()))])
    assert parse(request, view(signer.public_key), now=NOW + timedelta(seconds=300))  # at the edge: fresh
    with pytest.raises(Rejected, match="5 minutes"):
        parse(request, view(signer.public_key), now=NOW + timedelta(seconds=301))
    with pytest.raises(Rejected, match="5 minutes"):
        parse(request, view(signer.public_key), now=NOW - timedelta(seconds=301))


def test_staleness_uses_the_clock_by_default(signer, time_machine):
    request = signer.request([event("delivered", str(uuid.uuid4()))])
    time_machine.move_to(NOW + timedelta(seconds=10), tick=False)
    assert sendgrid_adapter.parse(request, view(signer.public_key))
    time_machine.move_to(NOW + timedelta(minutes=6), tick=False)
    with pytest.raises(Rejected):
        sendgrid_adapter.parse(request, view(signer.public_key))


def test_missing_headers_or_key_are_rejected(signer):
    request = signer.request([event("delivered", str(uuid.uuid4()))])
    for header in (SIGNATURE, TIMESTAMP):
        headers = {k: v for k, v in request.headers.items() if k != header}
        with pytest.raises(Rejected):
            parse(InboundRequest(request.url, headers, request.body), view(signer.public_key))
    with pytest.raises(Rejected, match="public_key"):
        parse(request, view(""))
    for bad in ("soon", "\u00b2\u00b2", "-1", "1e9"):  # not ASCII digits: refused, never an exception
        with pytest.raises(Rejected):
            headers = {**request.headers, TIMESTAMP: bad}
            parse(InboundRequest(request.url, headers, request.body), view(signer.public_key))


@pytest.mark.parametrize("body", [b"not json", b'{"event": "delivered"}', b"[1, 2]", b'[{"email": "x@example.com"}]'])
def test_a_signed_body_that_is_no_event_array_is_rejected(signer, body):
    with pytest.raises(Rejected):
        parse(signer.request([], body=body), view(signer.public_key))


def test_our_verdicts_match_the_sendgrid_package(signer):
    """Whatever the sendgrid package accepts, the adapter accepts, and the other way round."""
    ours, theirs = [], []
    good = signer.request([event("delivered", str(uuid.uuid4()))])
    other = Signer().request([event("delivered", str(uuid.uuid4()))])
    cases = [
        (good.body, good.headers[SIGNATURE], good.headers[TIMESTAMP]),
        (good.body + b" ", good.headers[SIGNATURE], good.headers[TIMESTAMP]),
        (good.body, other.headers[SIGNATURE], good.headers[TIMESTAMP]),
        (good.body, good.headers[SIGNATURE], str(int(good.headers[TIMESTAMP]) - 1)),
    ]
    for body, signature, timestamp in cases:
        theirs.append(EventWebhook(signer.public_key).verify_signature(body.decode(), signature, timestamp))
        request = InboundRequest(good.url, {SIGNATURE: signature, TIMESTAMP: timestamp}, body)
        try:
            parse(request, view(signer.public_key))
            ours.append(True)
        except Rejected:
            ours.append(False)
    assert ours == theirs == [True, False, False, False]
