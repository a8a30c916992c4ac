"""`POST /hooks/providers/{provider_id}`: a vendor's receipts, authenticated by the vendor's signature.

No bearer key, no session, no CSRF: the signature is the authentication. In the
WSGI server these requests reach `receive()` through `receipts.wsgi` without Django's handler and
middleware; the Django view below answers them the same way (the test client, development without
OMNIPOST_PUBLIC_URL).

- unknown provider id, or a provider whose kind has no inbound adapter (console, smtp: bounces
  arrive by mail): `404` — the URL is not an endpoint. Provider ids are small integers anyway, so
  hiding whether one exists (a `401`) would protect nothing; what a URL can do is guarded by the
  signature alone.
- body over `MAX_BODY_BYTES`: `413`, before anything is read.
- more than OMNIPOST_RATE_LIMIT_RECEIPTS requests a second to one provider: `429` with Retry-After
  (`receipts.throttle`), before the signature is checked; vendors retry.
- the adapter rejects the request (bad signature, another provider's secret, stale timestamp,
  unreadable payload): `401`, nothing stored. A view from the per-process cache that rejects is read
  afresh and tried once more (the secret may have just been rotated).
- the request verifies but carries a value OmniPost cannot store (a date-time outside
  1970-01-01..9999-12-30 UTC, core.validation.check_datetime_range): `400` naming the field, nothing
  stored.
- the adapter handled it without receipts (an SNS subscription confirmed): `200 {"received": 0}`.
- otherwise `apply_receipts`, in one statement with the process's concurrent requests
  (`receipts.grouping`), then `200 {"received": n}` (n receipts in the request, applied, duplicate
  or ignored alike: a vendor must not retry any of them).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from core import tracing
from core.masking import mask_text
from receipts import providers, throttle
from receipts.grouping import apply_grouped
from receipts.inbound import ADAPTERS, Handled, InboundRequest, Invalid, ProviderView, Receipt, Rejected
from receipts.services import ApplyResult

logger = logging.getLogger("omnipost.receipts")

MAX_BODY_BYTES = 1024 * 1024  # SNS caps messages at 256 KiB; SendGrid batches stay well under 1 MiB
FORM = "application/x-www-form-urlencoded"
_ATTEMPTS = 3  # fresh reads of a provider edited while its requests arrive


Answer = tuple[int, dict[str, Any], dict[str, str]]  # status, JSON body, extra headers


def error_answer(status: int, code: str, message: str, details: dict | None = None) -> Answer:
    return status, {"error": {"code": code, "message": message, "details": details or {}}}, {}


NOT_FOUND = error_answer(404, "not_found", "No inbound endpoint at this URL.")
TOO_LARGE = error_answer(413, "request_too_large", f"The body is over {MAX_BODY_BYTES} bytes.",
                         {"limit_bytes": MAX_BODY_BYTES})  # fmt: skip
NOT_POST = (405, {"error": {"code": "method_not_allowed", "message": "POST the provider's events here.",
                            "details": {}}}, {"Allow": "POST"})  # fmt: skip


def form_of(content_type: str, body: bytes) -> dict[str, str]:
    if content_type.split(";", 1)[0].strip().lower() != FORM:
        return {}
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=10_000))
    except (UnicodeDecodeError, ValueError):
        return {}


def receive(provider_id: int, inbound: InboundRequest) -> Answer:
    """Authenticate and apply one vendor request (the module docstring's rules after the size check)."""
    view, fresh = providers.get(provider_id)
    if view is None or view.kind not in ADAPTERS:
        return NOT_FOUND
    wait = throttle.admit(provider_id)
    if wait is not None:
        status, body, _ = error_answer(429, "rate_limited", "Too many requests to this provider's URL; retry.",
                                       {"retry_after_seconds": round(wait, 3)})  # fmt: skip
        return status, body, {"Retry-After": throttle.retry_after(wait)}
    for _ in range(_ATTEMPTS):
        outcome = _handle(inbound, view)
        if isinstance(outcome, tuple):
            return outcome
        if outcome is _REJECTED and fresh:
            return error_answer(401, "invalid_signature", "The request does not verify for this provider.")
        view, fresh = providers.load(provider_id), True  # rejected by a cached view, or the provider changed
        if view is None:
            return NOT_FOUND
    status, body, _ = error_answer(503, "unavailable", "The provider is being changed; retry.")
    return status, body, {"Retry-After": "1"}


_REJECTED, _STALE = object(), object()


def _handle(inbound: InboundRequest, view: ProviderView) -> Answer | object:
    """The answer, or _REJECTED / _STALE (the provider changed since `view` was read)."""
    try:
        receipts = ADAPTERS[view.kind](inbound, view)
    except Rejected as exc:
        logger.info("receipts rejected for provider %s (%s): %s", view.id, view.kind, mask_text(str(exc)))
        return _REJECTED
    except Handled:
        return 200, {"received": 0}, {}
    except Invalid as exc:
        return error_answer(400, "validation_error", "The request verifies but carries a value that cannot be "
                            "stored; nothing was stored.", {exc.field: [exc.message]})  # fmt: skip
    started = tracing.now() if tracing.ENABLED else 0
    result = apply_grouped(view, receipts)
    if result.stale:
        return _STALE
    if started:
        _trace(view, receipts, result, started)
    return 200, {"received": len(receipts)}, {}


def _trace(view: ProviderView, receipts: list[Receipt], result: ApplyResult, started: int) -> None:
    """A "notification.receipt" span in the trace of each notification a receipt names (core.tracing)."""
    try:
        ended = tracing.now()
        changed = {row.notification_id for row in result.changed}
        for receipt in receipts:
            try:
                notification_id = uuid.UUID(str(receipt.notification_id))
            except ValueError:
                continue  # names no notification: no trace to add to
            attributes = {
                "omnipost.provider_kind": view.kind,
                "omnipost.receipt_type": receipt.type[:40],
                "omnipost.receipt": receipt.receipt or "",
                "omnipost.receipt_changed": notification_id in changed,
            }
            tracing.child("notification.receipt", notification_id, started, ended, attributes)
    except Exception:  # noqa: BLE001 - never in the way of the answer: the receipts are stored
        logger.exception("could not trace receipts for provider %s", view.id)


def _respond(answer: Answer) -> JsonResponse:
    status, body, headers = answer
    response = JsonResponse(body, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


@csrf_exempt
def provider_receipts(request: HttpRequest, provider_id: int) -> JsonResponse:
    if request.method != "POST":
        return _respond(NOT_POST)
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY_BYTES:
        return _respond(TOO_LARGE)
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:  # no (or a wrong) Content-Length
        return _respond(TOO_LARGE)
    base = settings.OMNIPOST_PUBLIC_URL
    url = base + request.get_full_path() if base else request.build_absolute_uri()
    inbound = InboundRequest(url=url, headers=request.headers, body=body, form=form_of(request.content_type, body))
    return _respond(receive(provider_id, inbound))
