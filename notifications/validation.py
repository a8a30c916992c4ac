"""Validation of notification requests as plain functions: fast enough for 1,000 items a request.

`clean_notification(data)` checks one request item (types, per-channel recipient rules, limits)
without touching the database and returns a `Draft`; `services.build_specs()` then resolves
provider and template names and renders templates. Errors are `FieldErrors`: field → messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from core.channels import CHANNELS
from core.validation import (
    MAX_BODY_CHARS,
    MAX_METADATA_BYTES,
    MAX_SUBJECT_CHARS,
    FieldErrors,
    check_locale,
    check_name,
    check_object,
    check_recipient,
    check_text,
    parse_aware_datetime,
    unknown_fields,
)
from recipients.services import check_external_id

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MAX_CONTEXT_BYTES = 64 * 1024
MAX_SCHEDULE_AHEAD = timedelta(days=3660)
DEFAULT_PRIORITY = 5
DEFAULT_QUEUE = "default"

PUSH_FIELDS = ("data", "badge", "sound", "image_url", "action_url", "collapse_key", "ttl_seconds", "urgency")
# An in_app notification's own fields, kept beside the push fields in the row's channel fields (`push`).
IN_APP_FIELDS = ("data", "action_url", "ttl_seconds")
MAX_IN_APP_TTL_SECONDS = 31_536_000  # a year: the item is pruned once it has passed (inbox.apps)
MAX_IN_APP_DATA_BYTES = 4096
MAX_ACTION_URL_CHARS = 2048
NOTIFICATION_FIELDS = (
    "channel", "recipient", "subscriber", "category", "provider", "subject", "body", "template", "context",
    "locale", "priority", "queue", "scheduled_for", "metadata", "fallback", *PUSH_FIELDS,
)  # fmt: skip
DEFAULT_CATEGORY = "general"


@dataclass(slots=True)
class Draft:
    """One notification request, checked but not yet resolved against the tenant's data."""

    channel: str
    recipient: str
    provider: str | None = None
    template: str | None = None
    subject: str = ""
    body: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    priority: int = DEFAULT_PRIORITY
    queue: str = DEFAULT_QUEUE
    scheduled_for: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    subscriber: str | None = None  # an external id: the address comes from the subscriber (services)
    category: str = DEFAULT_CATEGORY
    fallback: Fallback | None = None  # the next channel if this one does not get through (notifications.fallback)
    # The push fields given (PUSH_FIELDS; checked against the vendors' limits once the provider is known)
    push: dict[str, Any] | None = None
    locale: str | None = None  # BCP 47: the template variant asked for (before the subscriber's)


@dataclass(frozen=True, slots=True)
class Fallback:
    """One fallback step: a linked notification on `channel`, due `after_seconds` after the provider
    accepted this one unless a `delivered` receipt comes first (at once on a failure)."""

    channel: str
    after_seconds: int

    def as_json(self) -> list[dict[str, Any]]:
        return [{"channel": self.channel, "after_seconds": self.after_seconds}]


FALLBACK_FIELDS = ("channel", "after_seconds")
FALLBACK_CHANNELS = ("email", "sms", "push")  # the channels a subscriber has addresses for
MAX_FALLBACK_SECONDS = int(MAX_SCHEDULE_AHEAD.total_seconds())


# --- single values --------------------------------------------------------------------------------


def check_priority(value: Any) -> int:
    # bool is an int subclass: `true` is not a priority.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 9:
        raise ValueError("must be an integer from 0 (lowest) to 9 (highest)")
    return value


def check_scheduled_for(value: Any, now: datetime | None = None) -> datetime | None:
    if value is None:
        return None
    when = parse_aware_datetime(value)
    now = now or timezone.now()
    if when - now > MAX_SCHEDULE_AHEAD:
        raise ValueError(f"must be at most {MAX_SCHEDULE_AHEAD.days} days ahead")
    return when


def check_queue(value: Any) -> str:
    if not isinstance(value, str) or not QUEUE_NAME.fullmatch(value):
        raise ValueError("must be a queue name: 1 to 64 letters, digits, '-' or '_', starting with a letter or digit")
    return value


def check_fallback(value: Any, channel: str | None) -> Fallback | None:
    """`[{"channel": "sms", "after_seconds": 300}]`: at most one step (one fallback chain per
    notification), on another channel a subscriber has an address for. `[]` means none."""
    if not isinstance(value, list):
        raise ValueError('must be a list of one step, e.g. [{"channel": "sms", "after_seconds": 300}]')
    if not value:
        return None
    if len(value) > 1:
        raise ValueError("at most one fallback step: a notification has at most one fallback chain")
    step = value[0]
    if not isinstance(step, dict):
        raise ValueError('each step must be an object {"channel": …, "after_seconds": …}')
    unknown = sorted(str(k) for k in step if k not in FALLBACK_FIELDS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} in the step; allowed: {', '.join(FALLBACK_FIELDS)}")
    next_channel = step.get("channel")
    if next_channel not in FALLBACK_CHANNELS:
        raise ValueError(f"the step's channel must be one of {', '.join(FALLBACK_CHANNELS)} (a subscriber's addresses)")
    if next_channel == channel:
        raise ValueError(f"the step's channel must differ from the notification's own ({channel!r})")
    seconds = step.get("after_seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= MAX_FALLBACK_SECONDS:
        raise ValueError(f"the step's after_seconds must be an integer from 0 to {MAX_FALLBACK_SECONDS}")
    return Fallback(next_channel, seconds)


# --- a whole notification -------------------------------------------------------------------------


def _in_app_fields(given: dict[str, Any], errors: dict[str, list[str]]) -> dict[str, Any]:
    """The in_app fields of a request (`data`: an object ≤ 4 KiB, `action_url`: text, `ttl_seconds`: how
    long the feed item lives); the push-only fields are refused by name."""
    fields: dict[str, Any] = {}
    for name, value in given.items():
        if name not in IN_APP_FIELDS:
            errors.setdefault(name, []).append("only for the push channel")
            continue
        try:
            if name == "data":
                fields[name] = check_object(value, MAX_IN_APP_DATA_BYTES)
            elif name == "ttl_seconds":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_IN_APP_TTL_SECONDS:
                    raise ValueError(f"must be an integer from 0 to {MAX_IN_APP_TTL_SECONDS}")
                fields[name] = value
            else:
                fields[name] = check_text(value, MAX_ACTION_URL_CHARS)
        except ValueError as exc:
            errors.setdefault(name, []).append(str(exc))
    return fields


def clean_notification(data: Any, *, now: datetime | None = None) -> Draft:
    """Check one notification request body; raise FieldErrors naming every bad field."""
    if not isinstance(data, dict):
        raise FieldErrors({"non_field_errors": ["each notification must be a JSON object"]})
    errors = unknown_fields(data, NOTIFICATION_FIELDS)

    def take(name: str, check: Any, *args: Any) -> Any:
        try:
            return check(data[name], *args)
        except ValueError as exc:
            errors.setdefault(name, []).append(str(exc))
            return None

    channel = data.get("channel")
    if channel is None:
        errors["channel"] = ["required: one of " + ", ".join(CHANNELS)]
    elif channel not in CHANNELS:
        errors["channel"] = [f"must be one of {', '.join(CHANNELS)}"]
        channel = None
    recipient = subscriber = None
    has_recipient, has_subscriber = data.get("recipient") is not None, data.get("subscriber") is not None
    if has_recipient and has_subscriber:
        errors["subscriber"] = ["give either `recipient` (an address) or `subscriber` (an external id), not both"]
    elif has_subscriber:
        subscriber = take("subscriber", check_external_id)
        if channel == "webhook":
            errors.setdefault("subscriber", []).append(
                "the webhook channel has no subscriber address: give `recipient` (the URL's token)"
            )
    elif channel == "in_app":
        errors["subscriber"] = ["required: an in_app notification goes to a subscriber's feed (an external id)"]
        if has_recipient:
            errors["recipient"] = ["not allowed for the in_app channel: give `subscriber` (an external id)"]
    elif not has_recipient:
        errors["recipient"] = ["required (or `subscriber`, an external id)"]
    elif channel is not None:
        recipient = take("recipient", check_recipient, channel)
    draft = Draft(channel=channel or "", recipient=recipient or "", subscriber=subscriber)
    for name, check, args in (
        ("category", check_name, ()),
        ("provider", check_name, ()),
        ("template", check_name, ()),
        ("subject", check_text, (MAX_SUBJECT_CHARS,)),
        ("body", check_text, (MAX_BODY_CHARS,)),
        ("context", check_object, (MAX_CONTEXT_BYTES,)),
        ("locale", check_locale, ()),
        ("priority", check_priority, ()),
        ("queue", check_queue, ()),
        ("scheduled_for", check_scheduled_for, (now,)),
        ("metadata", check_object, (MAX_METADATA_BYTES,)),
    ):
        if data.get(name) is not None:
            value = take(name, check, *args)
            if value is not None:
                setattr(draft, name, value)
    given = {name: data[name] for name in PUSH_FIELDS if data.get(name) is not None}
    if given and channel == "in_app":
        draft.push = _in_app_fields(given, errors)
    elif given:
        if channel != "push":
            for name in given:
                errors.setdefault(name, []).append("only for the push channel")
        else:
            draft.push = given
    if data.get("fallback") is not None:
        if subscriber is None:
            errors.setdefault("fallback", []).append(
                "needs `subscriber`: the fallback's address is the subscriber's on the next channel"
            )
        else:
            draft.fallback = take("fallback", check_fallback, channel)
    if draft.template is None:
        if data.get("context"):
            errors.setdefault("context", []).append("only allowed with `template`")
        if data.get("locale") is not None:
            errors.setdefault("locale", []).append("only allowed with `template`: it chooses the template's variant")
        if data.get("body") is None:
            errors.setdefault("body", []).append("required unless a `template` is given")
    else:
        for name in ("subject", "body"):
            if name in data:
                errors.setdefault(name, []).append("not allowed with `template`: the template provides it")
    if errors:
        raise FieldErrors(errors)
    return draft
