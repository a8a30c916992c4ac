"""The benchmark's lean receiver checks Standard Webhooks signatures as the reference library does."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from benchmarks.receiver import Verifier, _header, first_to_last_rate, steady_rate
from tests.support.receivers import TEST_SIGNING_SECRET

BODY = b'{"id":"n-1","body":"hello"}'


def signed(msg_id: str = "n-1", at: float | None = None, body: bytes = BODY) -> tuple[bytes, bytes]:
    at = time.time() if at is None else at
    signature = Webhook(TEST_SIGNING_SECRET).sign(msg_id, datetime.fromtimestamp(at, tz=UTC), body.decode())
    return str(int(at)).encode(), signature.encode()


def test_accepts_what_the_reference_library_signs():
    timestamp, signature = signed()
    assert Verifier(TEST_SIGNING_SECRET).verify("n-1", timestamp, signature, BODY, time.time())
    assert Verifier(TEST_SIGNING_SECRET).verify("n-1", timestamp, b"v1,bm90aGluZw== " + signature, BODY, time.time())


@pytest.mark.parametrize(
    ("msg_id", "body", "age", "mangle"),
    [
        ("n-2", BODY, 0, False),  # another id
        ("n-1", BODY + b" ", 0, False),  # another body
        ("n-1", BODY, 301, False),  # too old
        ("n-1", BODY, -301, False),  # from the future
        ("n-1", BODY, 0, True),  # a changed signature
        ("", BODY, 0, False),  # no id
    ],
)
def test_refuses_what_does_not_match(msg_id, body, age, mangle):
    now = time.time()
    timestamp, signature = signed(at=now - age)
    if mangle:
        signature = signature[:-2] + (b"AA" if not signature.endswith(b"AA") else b"BB")
    assert not Verifier(TEST_SIGNING_SECRET).verify(msg_id, timestamp, signature, body, now)
    assert not Verifier(TEST_SIGNING_SECRET).verify("n-1", b"not-a-number", signature, BODY, now)


def test_headers_are_found_whatever_their_case_and_position():
    head = b"POST /hook HTTP/1.1\r\nHost: x\r\nWebhook-ID:  n-1 \r\ncontent-LENGTH: 27"
    lower = head.lower()
    assert _header(head, lower, b"\r\nwebhook-id:") == b"n-1"
    assert _header(head, lower, b"\r\ncontent-length:") == b"27"  # the last line has no CRLF in the head
    assert _header(head, lower, b"\r\nwebhook-signature:") is None


def test_the_steady_rate_leaves_out_the_ramp_up_and_the_tail():
    # 100 arrivals: ten slow ones over the first 5 s, 80 at 100/s, ten slow ones over the last 5 s.
    times = [i * 0.5 for i in range(10)] + [5 + i * 0.01 for i in range(80)] + [6 + i * 0.5 for i in range(10)]
    assert 95 < steady_rate(times) < 105
    assert first_to_last_rate(times) == 100 / 10.5
    assert steady_rate(reversed(times)) == steady_rate(times)
    assert steady_rate([1.0] * 5) is None and steady_rate([1.0] * 20) is None
    assert first_to_last_rate([]) is None and first_to_last_rate([1.0] * 3) is None
