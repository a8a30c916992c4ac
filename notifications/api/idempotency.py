"""`Idempotency-Key` for the POSTs that create notifications (Stripe's semantics).

1. The key is claimed by INSERTing an `in_flight` record in its own short transaction; the unique
   (tenant, key) constraint decides between concurrent requests, never a check-then-insert.
2. The request runs in one transaction that also stores its response on the record (→ `completed`),
   so notifications are never committed without the response that replays them.
3. Only a request that started executing keeps its record (Stripe's rule): one that fails
   authentication or parsing never claims the key, and one that fails validation (a 400) releases
   it, so the corrected retry with the same key runs. A 5xx or any other exception releases it too.
A later request with the key replays the stored response (`Idempotent-Replayed: true`), or gets
422 `idempotency_key_reused` for another body, or 409 `idempotency_request_in_progress`.
Records expire after 24 h. An `in_flight` record older than IN_FLIGHT_TIMEOUT belongs to a request
that died (its transaction rolled back, so nothing was created) and is replaced; should that
request still be running, storing its response fails and it rolls back with a 409.
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
from django.db import IntegrityError, transaction
from django.http import HttpResponse
from django.utils import timezone
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.errors import Conflict, Unprocessable, exception_handler
from notifications.models import IdempotencyRecord

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_TTL = timedelta(hours=24)
IN_FLIGHT_TIMEOUT = timedelta(minutes=5)
KEY_PATTERN = re.compile(r"^[\x20-\x7e]{1,255}$")

State = IdempotencyRecord.State


def fingerprint(request: Request) -> str:
    """HMAC-SHA256 of the canonical JSON of method, path and parsed body."""
    canonical = json.dumps(
        {"method": request.method, "path": request.path, "body": request.data},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )  # fmt: skip
    return hmac.new(settings.SECRET_KEY.encode(), canonical.encode(), hashlib.sha256).hexdigest()


def _render(status: int, data: Any) -> HttpResponse:
    return HttpResponse(JSONRenderer().render(data), status=status, content_type="application/json")


def _replay(record: IdempotencyRecord) -> HttpResponse:
    response = HttpResponse(record.response_body, status=record.response_status, content_type="application/json")
    response[REPLAYED_HEADER] = "true"
    return response


def _claim(request: Request, key: str, digest: str) -> IdempotencyRecord | HttpResponse:
    records = IdempotencyRecord.objects.for_tenant(request.tenant)
    for _ in range(5):
        now = timezone.now()
        try:
            with transaction.atomic():
                return records.create(
                    tenant=request.tenant, key=key, fingerprint=digest, state=State.IN_FLIGHT, expires_at=now + KEY_TTL
                )
        except IntegrityError:
            pass
        existing = records.filter(key=key).first()
        if existing is None:  # released between our INSERT and this read
            continue
        abandoned = existing.state == State.IN_FLIGHT and existing.created_at < now - IN_FLIGHT_TIMEOUT
        if existing.expires_at <= now or abandoned:
            records.filter(pk=existing.pk, state=existing.state, expires_at=existing.expires_at).delete()
            continue
        if not hmac.compare_digest(existing.fingerprint, digest):
            raise Unprocessable(
                f"This {HEADER} was already used with a different request; use a new key for a new request.",
                code="idempotency_key_reused",
            )
        if existing.state == State.IN_FLIGHT:
            raise Conflict(
                f"A request with this {HEADER} is still in progress; retry after it finishes.",
                code="idempotency_request_in_progress",
            )
        return _replay(existing)
    raise Conflict(f"The {HEADER} is contended; retry.", code="idempotency_request_in_progress")


def _store(record: IdempotencyRecord, response: HttpResponse) -> int:
    return IdempotencyRecord.objects.filter(pk=record.pk, state=State.IN_FLIGHT).update(
        state=State.COMPLETED,
        response_status=response.status_code,
        response_body=response.content.decode(),
    )


def run_idempotent(request: Request, view: Any, handler: Callable[[], Response]) -> HttpResponse:
    """Run `handler` (which returns a Response) under the request's Idempotency-Key, if any."""
    key = request.headers.get(HEADER)
    if key is None:
        return handler()
    if not KEY_PATTERN.match(key):
        raise ValidationError({HEADER: ["must be 1 to 255 printable ASCII characters"]})
    claimed = _claim(request, key, fingerprint(request))
    if isinstance(claimed, HttpResponse):
        return claimed
    try:
        with transaction.atomic():
            result = handler()
            response = _render(result.status_code, result.data)
            if not _store(claimed, response):
                raise Conflict(
                    f"This request's {HEADER} was taken over after it timed out; nothing was created.",
                    code="idempotency_request_in_progress",
                )
        return response
    except (ValidationError, ParseError) as exc:
        _release(claimed)  # nothing ran: the corrected retry must not be told the key was used
        error = exception_handler(exc, {"view": view, "request": request})
        return _render(error.status_code, error.data)
    except BaseException:
        _release(claimed)
        raise


def _release(record: IdempotencyRecord) -> None:
    IdempotencyRecord.objects.filter(pk=record.pk, state=State.IN_FLIGHT).delete()
