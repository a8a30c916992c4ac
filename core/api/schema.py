"""API pieces every room's views share: the OpenAPI `Error` component, error responses per status,
request bodies that declare `additionalProperties: false` (unknown fields are refused), strictly typed
fields, refused unknown query parameters, and timestamps as the API writes them (`iso`)."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

from core.validation import unknown_fields


@lru_cache(maxsize=4096)  # rows of one batch share their timestamps
def iso(value: datetime | None) -> str | None:
    """DRF's datetime format, as every response writes it: ISO 8601 in UTC with a `Z`."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable code, e.g. validation_error, not_found.")
    message = serializers.CharField(help_text="What went wrong and how to fix it.")
    details = serializers.DictField(
        help_text="Field → messages for validation errors; for a batch "
        '{"notifications": {"<index>": {field: [messages]}}}.'
    )


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


_DESCRIPTIONS = {
    400: "Invalid request: `details` names each bad field.",
    401: "Missing, invalid or revoked API key.",
    404: "No such object for this tenant (another tenant's objects are never visible).",
    409: "Conflicts with the object's current state.",
    413: "Request body larger than OMNIPOST_MAX_REQUEST_BYTES.",
    422: "Idempotency-Key reused with a different request (idempotency_key_reused).",
    429: "Too many requests for this tenant; see the Retry-After header.",
    503: ("No database primary reachable (a failover under way), or the session was lost: a write may or may not "
          "have been stored; retry after Retry-After with the same Idempotency-Key."),
}


def errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """Error responses for `extend_schema(responses=…)`; 400 (unknown query parameters at least),
    401, 429 and 503 apply to every operation."""
    return {
        status: OpenApiResponse(ErrorSerializer, description=_DESCRIPTIONS[status])
        for status in sorted({400, 401, 429, 503, *statuses})
    }


# Refuses fields it does not declare as writable (no mass assignment of status, tenant, …).
# (A comment, not a docstring: drf-spectacular would copy a docstring into every component.)
class StrictSerializer(serializers.Serializer):

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            writable = tuple(name for name, f in self.fields.items() if not f.read_only)
            unknown = unknown_fields(data, writable)
            if unknown:
                raise serializers.ValidationError(unknown)
        return super().to_internal_value(data)


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    pass


def refuse_changes(instance: Any, attrs: dict[str, Any], immutable: tuple[str, ...]) -> None:
    """A PATCH may not change what names or shapes an object (its name, channel, kind…)."""
    changed = {
        name: ["cannot be changed after creation; create a new object instead"]
        for name in immutable
        if name in attrs and instance is not None and getattr(instance, name) != attrs[name]
    }
    if changed:
        raise serializers.ValidationError(changed)


class StrictSerializerSchema(OpenApiSerializerExtension):
    target_class = StrictSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: str) -> dict:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


class FullMatchValidator(RegexValidator):
    """A RegexValidator that wants the whole value to match: Django's `search` lets a pattern that ends
    in `$` match before a trailing newline ("+15550100123\n"), and a value with one would be stored."""

    def __call__(self, value: Any) -> None:  # noqa: ANN401
        if self.regex.fullmatch(str(value)) is None:
            raise DjangoValidationError(self.message, code=self.code, params={"value": value})


class FullRegexField(serializers.RegexField):
    """DRF's RegexField, matched against the whole value (FullMatchValidator). The pattern stays as
    written for the OpenAPI schema, where `$` (ECMA-262, no multiline flag) means the very end. Nor is
    the value trimmed first: a name sent with a newline is refused, not stored as some other name."""

    def __init__(self, regex: Any, **kwargs: Any) -> None:  # noqa: ANN401
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(regex, **kwargs)
        plain = self.validators[-1]
        self.validators[-1] = FullMatchValidator(plain.regex, message=plain.message)


# DRF coerces 5 → "5", "true" → True and "5" → 5; the schema promises exact JSON types, so these refuse
# anything else (a client sending the wrong type has a bug worth hearing about).
def _typed(base: type[serializers.Field], types: tuple[type, ...], message: str) -> type[serializers.Field]:
    def to_internal_value(self: serializers.Field, data: Any) -> Any:
        if isinstance(data, bool) != (bool in types) or not isinstance(data, types):
            raise serializers.ValidationError(message)
        return base.to_internal_value(self, data)

    return type(f"Strict{base.__name__}", (base,), {"to_internal_value": to_internal_value})


StrictCharField = _typed(serializers.CharField, (str,), "must be a string")
StrictRegexField = _typed(FullRegexField, (str,), "must be a string")
StrictBooleanField = _typed(serializers.BooleanField, (bool,), "must be true or false")
StrictIntegerField = _typed(serializers.IntegerField, (int,), "must be an integer")
StrictFloatField = _typed(serializers.FloatField, (int, float), "must be a number")


class StrictQueryMixin:
    """Refuses query parameters the operation does not declare (400 naming them), after auth."""

    query_params_allowed: tuple[str, ...] = ()

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        allowed = self.allowed_query_params()
        unknown = sorted(name for name in request.query_params if name not in allowed)
        if unknown:
            hint = ", ".join(allowed) or "none"
            raise serializers.ValidationError({name: [f"unknown query parameter; allowed: {hint}"] for name in unknown})

    def allowed_query_params(self) -> tuple[str, ...]:
        allowed = self.query_params_allowed
        if getattr(self, "action", None) == "list" and getattr(self, "pagination_class", None):
            paginator = self.pagination_class
            allowed = (*allowed, paginator.cursor_query_param, paginator.page_size_query_param)
        return allowed
