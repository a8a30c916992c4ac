"""Checks of API input that every room applies, as plain functions (fast enough for 1,000 items a
request): field errors in the API's shape, unknown fields, recipients per channel, names, JSON sizes,
texts and date-times. Each raises ValueError with what to fix; a room's own rules build on these."""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import EmailValidator

from core.channels import Channel
from core.plain_json import plain_size

E164 = re.compile(r"^\+[1-9]\d{1,14}$")
NAME = re.compile(r"^[-A-Za-z0-9_]{1,100}$")  # provider names, template keys, category keys are slugs
MAX_TOKEN_CHARS = 4096
MAX_METADATA_BYTES = 4096
MAX_SUBJECT_CHARS = 998  # RFC 5322 line length
MAX_BODY_CHARS = 256 * 1024


class _EagerEmailValidator(EmailValidator):
    """Django's EmailValidator with its own patterns compiled once, here: Django's are lazy objects,
    and every match went through their proxy (≈ 5 % of a 1,000-item batch's Python)."""

    user_regex = re.compile(EmailValidator.user_regex.pattern, EmailValidator.user_regex.flags)
    domain_regex = re.compile(EmailValidator.domain_regex.pattern, EmailValidator.domain_regex.flags)
    literal_regex = re.compile(EmailValidator.literal_regex.pattern, EmailValidator.literal_regex.flags)


_email = _EagerEmailValidator()


class FieldErrors(Exception):
    """field → list of messages, in the API's error `details` shape."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(errors)
        self.errors = errors


def unknown_fields(data: dict, allowed: tuple[str, ...] | frozenset[str]) -> dict[str, list[str]]:
    message = f"unknown field; allowed: {', '.join(allowed)}"
    return {key: [message] for key in sorted(map(str, data)) if key not in allowed}


def check_recipient(value: Any, channel: str) -> str:
    """The recipient if it suits the channel; raises ValueError with the reason."""
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if channel == Channel.EMAIL:
        if len(value) > 254:
            raise ValueError("must be an email address of at most 254 characters")
        try:
            _email(value)
        except DjangoValidationError:
            raise ValueError("must be an email address (RFC 5322 addr-spec, e.g. jane@example.com)") from None
        return value
    if channel == Channel.SMS:
        if not E164.fullmatch(value):
            raise ValueError("must be a phone number in E.164 format, e.g. +15551234567")
        return value
    if not 1 <= len(value) <= MAX_TOKEN_CHARS:
        raise ValueError(f"must be 1 to {MAX_TOKEN_CHARS} characters")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ValueError("must not contain control characters")
    return value


# The date-times OmniPost stores, from any input (API fields, vendors' receipts): PostgreSQL holds far
# more (4713 BC to 294276 AD), but Python's datetime, and so psycopg reading a row back, holds years
# 1 to 9999 only — and a reader shows a stored instant in its own offset (±14:00). An instant before
# year 1 or past 9999 in some offset made every later read of its row fail (GET notifications/{id}
# answered 500 for ever). Nothing OmniPost does predates the Unix epoch, and 9999-12-30 ends a day
# before any offset can carry an instant past 9999.
EARLIEST_DATETIME = datetime(1970, 1, 1, tzinfo=UTC)
END_OF_DATETIMES = datetime(9999, 12, 31, tzinfo=UTC)  # exclusive: 9999-12-30T23:59:59.999999Z is the last
DATETIME_RANGE_MESSAGE = "must be between 1970-01-01T00:00:00Z and 9999-12-30T23:59:59Z (UTC)"


def check_datetime_range(value: datetime) -> datetime:
    """An aware date-time as UTC if OmniPost can store it and every reader show it
    (EARLIEST_DATETIME ≤ value < END_OF_DATETIMES); ValueError otherwise. The one range check every
    date-time input goes through: the API's fields (parse_aware_datetime) and vendors' receipts."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must include a UTC offset (e.g. +00:00 or Z); naive date-times are ambiguous")
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):  # before year 1 or past 9999 once in UTC
        raise ValueError(DATETIME_RANGE_MESSAGE) from None
    if not EARLIEST_DATETIME <= utc < END_OF_DATETIMES:
        raise ValueError(DATETIME_RANGE_MESSAGE)
    return utc


def datetime_from_timestamp(value: Any) -> datetime:  # noqa: ANN401
    """A Unix time in seconds (an int or float, not a bool) as a UTC datetime in the range above."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a Unix time in seconds")
    try:
        return check_datetime_range(datetime.fromtimestamp(value, UTC))
    except (OverflowError, OSError, ValueError):
        raise ValueError(DATETIME_RANGE_MESSAGE) from None


def parse_aware_datetime(value: Any) -> datetime:
    """An ISO 8601 date-time that states its UTC offset, as a UTC datetime (within check_datetime_range)."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("must be an ISO 8601 date-time string with a UTC offset, e.g. 2030-01-31T09:00:00+01:00")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an ISO 8601 date-time, e.g. 2030-01-31T09:00:00+01:00") from None
    return check_datetime_range(parsed)


def json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON (orjson's count where it writes alike, core.plain_json)."""
    size = plain_size(value)
    return size if size is not None else len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def check_object(value: Any, limit: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    if json_size(value) > limit:
        raise ValueError(f"must be at most {limit} bytes as JSON")
    return value


def check_text(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    if len(value) > limit:
        raise ValueError(f"must be at most {limit} characters")
    return value


def check_name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ValueError("must be a name of 1 to 100 letters, digits, '-' or '_'")
    return value


# A well-formed BCP 47 language tag (RFC 5646's langtag, or a private-use tag): language[-script]
# [-region]*(-variant)*(-extension)[-privateuse]. Irregular grandfathered tags are not accepted.
_LOCALE = re.compile(
    r"^(?:(?:[a-z]{2,3}(?:-[a-z]{3}){0,3}|[a-z]{4,8})"
    r"(?:-[a-z]{4})?(?:-(?:[a-z]{2}|[0-9]{3}))?(?:-(?:[a-z0-9]{5,8}|[0-9][a-z0-9]{3}))*"
    r"(?:-[0-9a-wyz](?:-[a-z0-9]{2,8})+)*(?:-x(?:-[a-z0-9]{1,8})+)?|x(?:-[a-z0-9]{1,8})+)$",
    re.IGNORECASE,
)
MAX_LOCALE_CHARS = 35


def check_locale(value: Any) -> str:
    """A BCP 47 tag in its conventional case (`fr-ca` → `fr-CA`, `zh-hant-tw` → `zh-Hant-TW`)."""
    if not isinstance(value, str) or len(value) > MAX_LOCALE_CHARS or not _LOCALE.fullmatch(value):
        raise ValueError("must be a BCP 47 language tag such as fr, fr-CA or zh-Hant-TW")
    subtags = value.lower().split("-")
    out = [subtags[0]]
    extension = subtags[0] == "x"
    for subtag in subtags[1:]:
        if len(subtag) == 1:
            extension = True
        elif not extension and len(subtag) == 2:
            subtag = subtag.upper()
        elif not extension and len(subtag) == 4 and subtag.isalpha():
            subtag = subtag.title()
        out.append(subtag)
    return "-".join(out)


def base_language(tag: str) -> str:
    """A tag's primary language subtag (`fr-CA` → `fr`)."""
    return tag.split("-", 1)[0]
