"""The two calls most clients make, answered before Django's URL routing and DRF.

`POST /api/v1/notifications` (one notification) and `GET /api/v1/notifications/{id}` spent
about 400 µs of Python a request in the framework around them — URL resolution through nested
includes, sessions, CSRF, messages and auth middleware that a bearer-key API never uses, DRF's
request wrapping, content negotiation, permission and throttle classes and response rendering —
against ≈ 550 µs (create) and ≈ 250 µs (read) of actual work. This middleware answers them
directly with the very functions the views use (`views.create_rows`, `views.detail_data`,
`serializers.notification_data`), and only the plain successful case:

- the request has no query string, `Accept` is absent, `*/*` or `application/json`, a create's
  `Content-Type` is `application/json` and its `Idempotency-Key`, if any, is well-formed;
- the bearer key is valid (`ApiKey.authenticate`, the same cache), the body parses
  (`StrictJSONParser`), every field is valid and the names resolve;
- the tenant's rate limit allows it (`TenantRateThrottle.allow_tenant`), checked after the checks
  and before anything is stored, so a request that falls back is never counted twice.

A create's statement is shared with the process's concurrent creates for the same tenant and key
(`services.create_notifications_shared`, core.grouping): one statement, commit and WAL flush for
the few that arrive while the one before runs, each answered with its own notification.

A create with an `Idempotency-Key` runs the views' own `idempotency.run_keyed` and
`views.create_response` (its record stored by the notification's statement, alone): the first
answer is the record's bytes, a repeat replays them (`Idempotent-Replayed: true`), and 409
`idempotency_request_in_progress` / 422 `idempotency_key_reused` are rendered by the API's
exception handler, as the views render them. A body that fails its checks is handed over (the
views tell a 400 from a key bound to another body).

Anything else is handed on, untouched, to the ordinary stack, which answers it as it always has
(401, 400 with field errors, 404, 406, 409, 415, 422, 429 with `Retry-After`): nothing is stored
before the hand-over, so the second look decides alone. It sits after `RequestSizeLimitMiddleware`
(413 first), `SecurityMiddleware` (HTTPS redirect, HSTS, nosniff) and `XFrameOptionsMiddleware`,
inside Django's handler (request signals, connection upkeep, error pages), so responses carry the
same headers; DRF's `Allow` header is added as its views send it. Statement counts are the views'.
Other exceptions (a database error: a create might have been stored) are not handed over: a lost
session or no reachable primary is answered `503 unavailable` with Retry-After (the client never
saw a 201, so it retries), anything else reaches Django's handler (its JSON 500), as DRF re-raises
them from the views. A key that fails
here is looked up again by the views (one query more for a well-formed but unknown key).
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from uuid import UUID

from django.http import HttpRequest, HttpResponse
from rest_framework.exceptions import APIException, ParseError, ValidationError

from core.api.errors import exception_handler
from core.api.parsers import StrictJSONParser
from core.api.renderers import JSONRenderer
from core.api.throttling import TenantRateThrottle
from core.db_faults import is_connection_lost
from core.middleware import unavailable_response
from core.models import ApiKey, Tenant
from core.plain_json import plain_json
from notifications.api import idempotency
from notifications.api.serializers import notification_data
from notifications.api.views import create_response, create_rows, detail_data
from notifications.services import IdempotentResponse

LIST_PATH = "/api/v1/notifications"
DETAIL_PATH = re.compile(r"/api/v1/notifications/([0-9a-fA-F-]{36})")
ACCEPTS = frozenset({"", "*/*", "application/json"})
JSON_TYPES = frozenset({"application/json", "application/json; charset=utf-8", "application/json;charset=utf-8"})
# What DRF's views send (their `Allow` header) for the two routes.
ALLOW_LIST = "GET, POST, HEAD, OPTIONS"
ALLOW_DETAIL = "GET, HEAD, OPTIONS"


class _HandOver(Exception):
    """Let the ordinary stack answer (it decides again, from the start)."""


class HotPathMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        if meta.get("QUERY_STRING") or meta.get("HTTP_ACCEPT", "") not in ACCEPTS:
            return self.get_response(request)
        path, method = request.path_info, request.method
        try:
            if method == "POST" and path == LIST_PATH:
                return self._create(request)
            if method == "GET":
                match = DETAIL_PATH.fullmatch(path)
                if match:
                    return self._detail(request, match[1])
        except (_HandOver, APIException):
            pass  # nothing was stored: the views answer it, errors included
        except Exception as exc:
            if is_connection_lost(exc):  # no primary: nothing was acknowledged, so 503, never a 201
                return unavailable_response()
            raise
        return self.get_response(request)

    @staticmethod
    def _key(request: HttpRequest) -> ApiKey:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        scheme, _, raw_key = header.partition(" ")
        key = ApiKey.authenticate(raw_key.strip()) if scheme.lower() == "bearer" else None
        if key is None:
            raise _HandOver()
        return key

    def _create(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        if meta.get("CONTENT_TYPE", "").lower() not in JSON_TYPES:
            raise _HandOver()
        idempotency_key = meta.get("HTTP_IDEMPOTENCY_KEY")
        if idempotency_key is not None and not idempotency.KEY_PATTERN.fullmatch(idempotency_key):
            raise _HandOver()  # the views' 400
        key = self._key(request)
        tenant = key.tenant
        data = StrictJSONParser().parse(io.BytesIO(request.body))  # ParseError: the views say why
        throttle = TenantRateThrottle()
        counted = False

        def rate_limit() -> None:
            nonlocal counted  # once a request, however often a keyed create tries again
            if counted:
                return
            if not throttle.allow_tenant(tenant):
                raise _HandOver()  # the views' throttle answers 429 with Retry-After
            counted = True

        actor = f"api_key:{key.prefix}"
        if idempotency_key is not None:
            return self._keyed(request, tenant, actor, idempotency_key, data, rate_limit)
        rows = create_rows(tenant, actor, [data], single=True, before_store=rate_limit, shared=True)
        return self._json(notification_data(rows[0]), 201, ALLOW_LIST)

    @staticmethod
    def _keyed(
        request: HttpRequest, tenant: Tenant, actor: str, idempotency_key: str, data: object,
        rate_limit: Callable[[], None],
    ) -> HttpResponse:  # fmt: skip
        """A create with an Idempotency-Key, as the views run it (idempotency.run_keyed)."""

        def create(record: IdempotentResponse) -> HttpResponse:
            try:
                return create_response(tenant, actor, [data], single=True, record=record, before_store=rate_limit,
                                       shared=True)  # fmt: skip
            except (ValidationError, ParseError):
                raise _HandOver() from None  # invalid: the views answer it (400, or the key's 422 / replay)

        digest = idempotency.fingerprint_of("POST", request.path, data)
        try:
            response = idempotency.run_keyed(tenant, idempotency_key, digest, create)
        except APIException as exc:
            answer = exception_handler(exc, {}) if _answered_here(exc) else None
            if answer is None:
                raise
            response = HttpResponse(_render(answer.data), status=answer.status_code, content_type="application/json")
        response["Allow"] = ALLOW_LIST
        response["Content-Length"] = str(len(response.content))
        return response

    def _detail(self, request: HttpRequest, pk: str) -> HttpResponse:
        try:
            notification_id = UUID(pk)
        except ValueError:
            raise _HandOver() from None
        key = self._key(request)
        data = detail_data(key.tenant, notification_id)
        # Read first, then the rate limit, so a 404 handed over is not counted twice; a read stores
        # nothing, so the views' second look (their 404, or 429 with Retry-After) costs one query.
        if data is None or not TenantRateThrottle().allow_tenant(key.tenant):
            raise _HandOver()
        return self._json(data, 200, ALLOW_DETAIL)

    @staticmethod
    def _json(data: object, status: int, allow: str) -> HttpResponse:
        content = _render(data)
        response = HttpResponse(content, status=status, content_type="application/json")
        response["Allow"] = allow
        response["Content-Length"] = str(len(content))  # as CommonMiddleware sets it for the views
        return response


def _answered_here(exc: APIException) -> bool:
    """An answer of the Idempotency-Key itself (409 in progress or contended, 422 reused): given
    after the rate limit counted the request, so answered here rather than counted twice."""
    code = getattr(exc.detail, "code", None)
    return code in ("idempotency_request_in_progress", "idempotency_key_reused")


def _render(data: object) -> bytes:
    """What the views' renderer writes (core.api.renderers: orjson, else DRF's JSONRenderer)."""
    return plain_json(data) or JSONRenderer().render(data)
