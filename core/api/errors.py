"""One error shape for the whole API: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.db_faults import is_connection_lost, reset_connection
from core.middleware import UNAVAILABLE_CODE, UNAVAILABLE_MESSAGE, UNAVAILABLE_RETRY_AFTER


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The request conflicts with the current state of the resource."


class Unprocessable(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "unprocessable"
    default_detail = "The request could not be processed."


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"
    default_detail = "Request body is too large."


_CODES = {
    exceptions.ValidationError: "validation_error",
    exceptions.ParseError: "parse_error",
    exceptions.AuthenticationFailed: "unauthenticated",
    exceptions.NotAuthenticated: "unauthenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "rate_limited",
}


def _messages(detail: Any) -> Any:
    """ErrorDetail trees → plain strings, keeping the field structure."""
    if isinstance(detail, dict):
        return {str(k): _messages(v) for k, v in detail.items()}
    if isinstance(detail, list):
        return [_messages(v) for v in detail]
    return str(detail)


def error_body(code: str, message: str, details: Any = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if is_connection_lost(exc):  # no primary reachable: 503, whatever DEBUG says (core.middleware)
        reset_connection()  # a session left on a read-only server (25006) is dropped too
        return Response(error_body(UNAVAILABLE_CODE, UNAVAILABLE_MESSAGE), status=503,
                        headers={"Retry-After": UNAVAILABLE_RETRY_AFTER})  # fmt: skip
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        code = "validation_error"
        details = _messages(exc.detail)
        if isinstance(details, list):
            details = {"non_field_errors": details}
        message = "The request has invalid fields; see details."
    else:
        detail = exc.detail
        # Our own exceptions carry a specific code (e.g. Conflict(code="already_delivered")).
        code = _CODES.get(type(exc)) or getattr(detail, "code", None) or exc.default_code
        details = _messages(detail) if isinstance(detail, dict) else {}
        if isinstance(exc, exceptions.Throttled) and "Retry-After" in response.headers:
            details = {"retry_after_seconds": int(response.headers["Retry-After"])}
        message = str(detail) if not isinstance(detail, dict) else "Request failed; see details."
    response.data = error_body(code, message, details)
    return response
