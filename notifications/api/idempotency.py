"""`Idempotency-Key` for the POSTs that create notifications (Stripe's semantics).

1. The record is written by the same statement as the notifications it covers, completed, with the
   response it replays (`services.create_notifications(idempotency=…)`): the response is rendered
   before anything is stored, so notifications are never committed without it, and a create with
   a key costs no statement more than one without.
2. The unique (tenant, key) constraint decides between concurrent requests, never a check-then-insert;
   an advisory lock taken in that statement tells a request whose twin is being stored at this
   moment (409 `idempotency_request_in_progress`) from one that finds the record stored.
3. Only a request that executed keeps its record (Stripe's rule): one that fails authentication,
   parsing or validation (a 400) or raises never wrote one, so the corrected retry with the key runs.
A later request with the key replays the stored response (`Idempotent-Replayed: true`), or gets
422 `idempotency_key_reused` for another body. Records expire after 24 h; an expired record is
replaced by the next request with its key, as is an `in_flight` record (written by earlier
versions, which claimed first and stored the response later) older than IN_FLIGHT_TIMEOUT.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.errors import Conflict, Unprocessable
from core.api.renderers import JSONRenderer
from core.models import Tenant, mode_of
from notifications import services
from notifications.models import IdempotencyRecord

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_TTL = timedelta(hours=24)
IN_FLIGHT_TIMEOUT = timedelta(minutes=5)
KEY_PATTERN = re.compile(r"^[\x20-\x7e]{1,255}$")

State = IdempotencyRecord.State


def fingerprint(request: Request) -> str:
    """HMAC-SHA256 of the canonical JSON of method, path and parsed body."""
    return fingerprint_of(request.method or "", request.path, request.data)


def fingerprint_of(method: str, path: str, body: Any) -> str:  # noqa: ANN401
    """`fingerprint` from its parts (the API's hot path has no DRF request)."""
    canonical = json.dumps(
        {"method": method, "path": path, "body": body},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )  # fmt: skip
    return hmac.new(settings.SECRET_KEY.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def check_key(key: str) -> None:
    """A 400 for a key that is not 1 to 255 printable ASCII characters."""
    if not KEY_PATTERN.fullmatch(key):
        raise ValidationError({HEADER: ["must be 1 to 255 printable ASCII characters"]})


def _replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(record.response_body, status=record.response_status, content_type="application/json")
    response[REPLAYED_HEADER] = "true"
    return response


def _existing(tenant: Tenant, key: str, digest: str) -> HttpResponse | None:
    """What a request gets whose key has a record: the replay, or 422 / 409; None when the record
    went away or expired meanwhile (the caller tries again)."""
    existing = IdempotencyRecord.objects.for_tenant(tenant).filter(key=key).first()
    now = timezone.now()
    if existing is None or existing.expires_at <= now:
        return None
    if not hmac.compare_digest(existing.fingerprint, digest):
        raise Unprocessable(
            f"This {HEADER} was already used with a different request; use a new key for a new request.",
            code="idempotency_key_reused",
        )
    if existing.state == State.IN_FLIGHT:
        if existing.created_at < now - IN_FLIGHT_TIMEOUT:
            return None
        raise _in_progress()
    return _replay(existing)


def _in_progress() -> Conflict:
    return Conflict(
        f"A request with this {HEADER} is still in progress; retry after it finishes.",
        code="idempotency_request_in_progress",
    )


def run_idempotent(
    request: Request, view: Any, handler: Callable[[services.IdempotentResponse | None], HttpResponse]
) -> HttpResponse:
    """Run `handler` under the request's Idempotency-Key, if any: it gets the record to store with
    its notifications (None without a key) and returns the response."""
    key = request.headers.get(HEADER)
    if key is None:
        return handler(None)
    check_key(key)
    return run_keyed(request.tenant, key, fingerprint(request), handler)


def run_keyed(
    tenant: Tenant, key: str, digest: str, handler: Callable[[services.IdempotentResponse], HttpResponse]
) -> HttpResponse:
    """`run_idempotent` for a checked `key` and the request's `digest` (`fingerprint`): the views'
    and the API's hot path's (notifications.api.hot). A test key's digest differs from a live key's
    for the same request, so a key used in the other mode is `422`, never the other mode's replay."""
    if mode_of(tenant):
        digest = hmac.new(settings.SECRET_KEY.encode(), f"test:{digest}".encode(), hashlib.sha256).hexdigest()
    for _ in range(5):
        now = timezone.now()
        record = services.IdempotentResponse(
            key=key, fingerprint=digest, created_at=now, expires_at=now + KEY_TTL,
            abandoned_before=now - IN_FLIGHT_TIMEOUT, render=lambda rows: (0, b""),
        )  # fmt: skip
        try:
            return handler(record)
        except services.IdempotencyKeyTaken as taken:
            if taken.in_progress:
                raise _in_progress() from None
        except (ValidationError, ParseError):
            # Invalid, so it stored nothing; but a key bound to another request is a misuse first (422).
            if _existing(tenant, key, digest) is None:
                raise
        answer = _existing(tenant, key, digest)
        if answer is not None:
            return answer
    raise Conflict(f"The {HEADER} is contended; retry.", code="idempotency_request_in_progress")


def run_idempotent_in_transaction(request: Request, view: Any, handler: Callable[[], Response]) -> HttpResponse:
    """`run_idempotent` for a workflow of several statements (enrollments): `handler` runs in a
    transaction that then stores the record with the response it rendered (all or nothing)."""
    key = request.headers.get(HEADER)
    if key is None:
        return handler()
    check_key(key)
    digest = fingerprint(request)
    for _ in range(5):
        answer = _existing(request.tenant, key, digest)
        if answer is not None:
            return answer
        now = timezone.now()
        record = services.IdempotentResponse(
            key=key, fingerprint=digest, created_at=now, expires_at=now + KEY_TTL,
            abandoned_before=now - IN_FLIGHT_TIMEOUT, render=lambda rows: (0, b""),
        )  # fmt: skip
        try:
            with transaction.atomic():
                if not services.try_idempotency_lock(request.tenant, key):
                    raise _in_progress()
                result = handler()
                record.status, record.body = render(result.status_code, result.data)
                services.store_idempotency_record(request.tenant, record)
            return respond(record)
        except services.IdempotencyKeyTaken:
            continue
    raise Conflict(f"The {HEADER} is contended; retry.", code="idempotency_request_in_progress")


def render(status: int, data: Any) -> tuple[int, bytes]:
    return status, JSONRenderer().render(data)


def respond(record: services.IdempotentResponse) -> HttpResponse:
    """The first response of a key: the very bytes its replays will carry."""
    return HttpResponse(record.body, status=record.status, content_type="application/json")
