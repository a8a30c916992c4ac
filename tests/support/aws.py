"""Loopback stand-ins for Amazon SES (v2 SendEmail, SigV4-verified) and SNS (signed HTTP notifications).

`SesStandIn` recomputes every request's SigV4 signature with botocore's own signer from what arrived
(method, URL, the signed headers, the body, `X-Amz-Date`) and the secret key it was given, and answers
403 `SignatureDoesNotMatch` when it differs, as SES does.

`SnsStandIn` signs SNS messages the way SNS does (the canonical string of the message type, SHA1withRSA
for SignatureVersion 1, SHA256withRSA for 2) with a key whose self-signed certificate it serves at
`cert_url`; it records the GETs of its `SubscribeURL`s.
"""

from __future__ import annotations

import base64
import datetime as dt
import hmac
import json
import re
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

_AUTH_RE = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
    r" SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})"
)


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    verified: bool | None = None  # SigV4 outcome (SES stand-in only)
    problem: str = ""

    @property
    def payload(self) -> Any:
        return json.loads(self.body) if self.body else None


class _Server:
    """A threaded HTTP server on 127.0.0.1 whose `handle(Recorded) -> (status, headers, body)` answers."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                rec = Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                status, headers, out = owner.handle(rec)
                with owner._lock:
                    owner.requests.append(rec)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, rec: Recorded) -> tuple[int, dict[str, str], bytes]:
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def verify_sigv4(rec: Recorded, url: str, secret_key: str, *, region: str, service: str = "ses") -> str:
    """'' when `rec` carries a valid SigV4 signature for `url`, else what is wrong (botocore recomputes)."""
    match = _AUTH_RE.fullmatch(rec.headers.get("authorization", ""))
    if match is None:
        return "no SigV4 Authorization header"
    amz_date = rec.headers.get("x-amz-date", "")
    if match["date"] != amz_date[:8]:
        return "credential scope date differs from X-Amz-Date"
    if (match["region"], match["service"]) != (region, service):
        return f"credential scope {match['region']}/{match['service']}, expected {region}/{service}"
    signed = match["signed"].split(";")
    if "host" not in signed or "x-amz-date" not in signed:
        return "host and x-amz-date must be signed"
    when = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    if abs((dt.datetime.now(dt.UTC) - when).total_seconds()) > 300:
        return "request time too skewed"
    signer = SigV4Auth(Credentials(match["key"], secret_key), service, region)
    request = AWSRequest(method=rec.method, url=url, data=rec.body, headers={h: rec.headers[h] for h in signed})
    request.context["timestamp"] = amz_date
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    if not hmac.compare_digest(expected, match["signature"]):
        return "signature does not match"
    return ""


class SesStandIn(_Server):
    """SES v2 `POST /v2/email/outbound-emails`: verifies SigV4, then answers as configured."""

    def __init__(self, *, access_key_id: str, secret_access_key: str, region: str = "eu-west-1") -> None:
        super().__init__()
        self.access_key_id, self.secret_access_key, self.region = access_key_id, secret_access_key, region
        self.status = 200
        self.error_type = ""  # x-amzn-ErrorType of a non-2xx answer
        self.error_message = ""
        self.retry_after: str | None = None
        self.on_accept = None  # callable(Recorded) after a verified, accepted send
        self.message_ids: list[str] = []  # the MessageId of each accepted send, in order

    def configure(self, status: int = 200, error_type: str = "", error_message: str = "", retry_after=None) -> None:
        self.status, self.error_type, self.error_message, self.retry_after = (
            status,
            error_type,
            error_message,
            retry_after,
        )

    @property
    def accepted(self) -> list[Recorded]:
        return [r for r in self.requests if r.verified]

    def handle(self, rec: Recorded) -> tuple[int, dict[str, str], bytes]:
        host = rec.headers.get("host", "")
        problem = verify_sigv4(rec, f"http://{host}{rec.path}", self.secret_access_key, region=self.region)
        rec.verified, rec.problem = not problem, problem
        json_type = {"Content-Type": "application/json"}
        if problem:
            err = {"message": f"The request signature we calculated does not match ({problem})"}
            return 403, json_type | {"x-amzn-ErrorType": "SignatureDoesNotMatch:"}, json.dumps(err).encode()
        if rec.method != "POST" or rec.path != "/v2/email/outbound-emails":
            return 404, json_type | {"x-amzn-ErrorType": "NotFoundException:"}, b'{"message":"no such route"}'
        if 200 <= self.status < 300:
            if self.on_accept is not None:
                self.on_accept(rec)
            message_id = f"0102{uuid.uuid4().hex}-000000"
            self.message_ids.append(message_id)
            return self.status, json_type, json.dumps({"MessageId": message_id}).encode()
        headers = dict(json_type)
        if self.error_type:
            headers["x-amzn-ErrorType"] = f"{self.error_type}:http://internal.amazon.com/coral/com.amazonaws.sesv2/"
        if self.retry_after is not None:
            headers["Retry-After"] = self.retry_after
        return self.status, headers, json.dumps({"message": self.error_message}).encode()


def self_signed(common_name: str = "sns.amazonaws.com", *, days: int = 30):
    """(private key, PEM of a self-signed certificate for it)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    return key, cert.public_bytes(serialization.Encoding.PEM)


NOTIFICATION_FIELDS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
SUBSCRIPTION_FIELDS = ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")


def sns_string_to_sign(message: dict) -> bytes:
    """As AWS documents it (written here independently of receipts.vendors.ses)."""
    names = NOTIFICATION_FIELDS if message["Type"] == "Notification" else SUBSCRIPTION_FIELDS
    return "".join(f"{n}\n{message[n]}\n" for n in names if n in message).encode()


class SnsStandIn(_Server):
    """Serves the signing certificate (`/SimpleNotificationService-test.pem`) and the SubscribeURL."""

    CERT_PATH = "/SimpleNotificationService-0123456789abcdef.pem"

    def __init__(self, *, topic_arn: str = "arn:aws:sns:eu-west-1:123456789012:ses-events") -> None:
        super().__init__()
        self.topic_arn = topic_arn
        self.key, self.cert_pem = self_signed()
        self.served_pem = self.cert_pem  # what the certificate URL answers (tests swap it)
        self.confirmations: list[Recorded] = []
        self.confirm_status = 200  # what the SubscribeURL answers

    @property
    def cert_url(self) -> str:
        return self.base_url + self.CERT_PATH

    @property
    def cert_url_pattern(self) -> str:
        return rf"^http://127\.0\.0\.1:{self.port}/[^?#]*\.pem$"

    def handle(self, rec: Recorded) -> tuple[int, dict[str, str], bytes]:
        if rec.method == "GET" and rec.path == self.CERT_PATH:
            return 200, {"Content-Type": "application/x-pem-file"}, self.served_pem
        if rec.method == "GET" and rec.path.startswith("/?Action=ConfirmSubscription"):
            self.confirmations.append(rec)
            if self.confirm_status != 200:
                return self.confirm_status, {"Content-Type": "text/xml"}, b"<ErrorResponse/>"
            body = b"<ConfirmSubscriptionResponse><ConfirmSubscriptionResult><SubscriptionArn>"
            return 200, {"Content-Type": "text/xml"}, body + self.topic_arn.encode() + b":sub</SubscriptionArn>"
        return 404, {}, b""

    def sign(self, message: dict, version: str = "1", key=None) -> dict:
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
        signature = (key or self.key).sign(sns_string_to_sign(message), padding.PKCS1v15(), algorithm)
        return message | {
            "SignatureVersion": version,
            "Signature": base64.b64encode(signature).decode(),
            "SigningCertURL": self.cert_url,
        }

    def notification(self, event: dict, *, version: str = "1", subject: str | None = None, **overrides) -> dict:
        message = {
            "Type": "Notification",
            "MessageId": str(uuid.uuid4()),
            "TopicArn": self.topic_arn,
            "Message": json.dumps(event),
            "Timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "UnsubscribeURL": f"{self.base_url}/?Action=Unsubscribe&SubscriptionArn={self.topic_arn}:sub",
        }
        if subject is not None:
            message["Subject"] = subject
        return self.sign(message | overrides, version)

    def subscription_confirmation(self, *, version: str = "1", subscribe_url: str | None = None) -> dict:
        token = uuid.uuid4().hex * 2
        message = {
            "Type": "SubscriptionConfirmation",
            "MessageId": str(uuid.uuid4()),
            "Token": token,
            "TopicArn": self.topic_arn,
            "Message": f"You have chosen to subscribe to the topic {self.topic_arn}. Visit the SubscribeURL.",
            "SubscribeURL": subscribe_url
            or f"{self.base_url}/?Action=ConfirmSubscription&TopicArn={self.topic_arn}&Token={token}",
            "Timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        return self.sign(message, version)


def ses_event(event_type: str, notification_id: str, recipient: str = "jane.doe@example.com", **extra) -> dict:
    """An SES event-publishing record as SES puts it in an SNS Message."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    mail = {
        "timestamp": now,
        "source": "alerts@example.com",
        "sendingAccountId": "123456789012",
        "messageId": "0102018c" + uuid.uuid4().hex,
        "destination": [recipient],
        "headersTruncated": False,
        "tags": {"notification_id": [notification_id], "ses:configuration-set": ["omnipost"]},
    }
    event: dict[str, Any] = {"eventType": event_type, "mail": mail}
    if event_type == "Bounce":
        event["bounce"] = {
            "bounceType": extra.get("bounce_type", "Permanent"),
            "bounceSubType": extra.get("bounce_subtype", "General"),
            "bouncedRecipients": [
                {
                    "emailAddress": recipient,
                    "action": "failed",
                    "status": "5.1.1",
                    "diagnosticCode": f"smtp; 550 5.1.1 <{recipient}>: Recipient address rejected",
                }
            ],
            "timestamp": now,
            "feedbackId": "0102018c-feedback",
            "reportingMTA": "dsn; a8-70.smtp-out.amazonses.com",
        }
    elif event_type == "Complaint":
        event["complaint"] = {
            "complainedRecipients": [{"emailAddress": recipient}],
            "timestamp": now,
            "feedbackId": "0102018c-complaint",
            "complaintFeedbackType": "abuse",
            "userAgent": "Mail client",
        }
    elif event_type == "Delivery":
        event["delivery"] = {
            "timestamp": now,
            "processingTimeMillis": 1234,
            "recipients": [recipient],
            "smtpResponse": f"250 2.6.0 Message received for <{recipient}>",
            "reportingMTA": "a8-70.smtp-out.amazonses.com",
        }
    elif event_type == "DeliveryDelay":
        event["deliveryDelay"] = {"timestamp": now, "delayType": "TransientCommunicationFailure"}
    return event
