"""A workflow's steps: what each type takes, checked field by field (pure functions, no query).

Errors come in the batch shape: `{"steps": {"<index>": {field: [messages]}}}`, or `{"steps":
[message]}` for the list itself. Step fields sit beside `name` and `type`."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from rest_framework.exceptions import ValidationError

from routing import quiet_hours

MAX_STEPS = 20
MAX_NAME = 100
MAX_WINDOW_SECONDS = 31 * 24 * 3600
MAX_DELAY_SECONDS = 366 * 24 * 3600
SEND_CHANNELS = ("email", "sms", "push", "in_app")  # the channels a subscriber has an address (or feed) for
SKIP_STATES = ("delivered", "seen", "read")
HH_MM = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")
KEY_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")

FIELDS = {
    "send": {"channel", "template", "subject", "body", "provider", "skip_if"},
    "delay": {"seconds", "until_local"},
    "digest": {"window_seconds", "key"},
    "throttle": {"limit", "window_seconds", "key"},
}


def _positive_number(value: Any, most: float) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= most:
        return f"must be a number of seconds above 0 and at most {most:g}"
    return None


def _text(value: Any, most: int) -> str | None:
    if not isinstance(value, str) or not value or len(value) > most:
        return f"must be a string of 1 to {most} characters"
    return None


def _send(step: dict[str, Any], earlier_sends: set[str], problems: dict[str, list[str]]) -> None:
    if step.get("channel") not in SEND_CHANNELS:
        problems["channel"] = [f"must be one of {', '.join(SEND_CHANNELS)}"]
    template = step.get("template")
    if template is not None:
        if _text(template, 100):
            problems["template"] = ["must be a template key"]
        for name in ("subject", "body"):
            if step.get(name) is not None:
                problems[name] = ["give either `template` or `subject`/`body`, not both"]
    else:
        if _text(step.get("body"), 100_000):
            problems["body"] = ["required (or `template`): the text to send"]
        if step.get("subject") is not None and not isinstance(step.get("subject"), str):
            problems["subject"] = ["must be a string"]
    if step.get("provider") is not None and _text(step["provider"], 100):
        problems["provider"] = ["must be a provider name"]
    skip_if = step.get("skip_if")
    if skip_if is not None:
        if not isinstance(skip_if, dict) or set(skip_if) != {"step", "state"}:
            problems["skip_if"] = ['must be {"step": "<an earlier send step>", "state": "delivered"|"seen"|"read"}']
        else:
            if skip_if["step"] not in earlier_sends:
                problems["skip_if"] = [f"step {skip_if['step']!r} is not an earlier send step of this workflow"]
            if skip_if["state"] not in SKIP_STATES:
                problems.setdefault("skip_if", []).append(f"state must be one of {', '.join(SKIP_STATES)}")


def _delay(step: dict[str, Any], problems: dict[str, list[str]]) -> None:
    seconds, until = step.get("seconds"), step.get("until_local")
    if (seconds is None) == (until is None):
        problems["seconds"] = ['give exactly one of `seconds` or `until_local` ("HH:MM")']
    elif seconds is not None and (message := _positive_number(seconds, MAX_DELAY_SECONDS)):
        problems["seconds"] = [message]
    elif until is not None and (not isinstance(until, str) or not HH_MM.fullmatch(until)):
        problems["until_local"] = ['must be a local time "HH:MM" (00:00 to 23:59)']


def _window(step: dict[str, Any], problems: dict[str, list[str]]) -> None:
    if message := _positive_number(step.get("window_seconds"), MAX_WINDOW_SECONDS):
        problems["window_seconds"] = [message]
    key = step.get("key")
    if key is not None and (not isinstance(key, str) or len(key) > 200 or not KEY_PATH.fullmatch(key)):
        problems["key"] = ['must be a dotted path into the trigger\'s data, e.g. "thread_id" or "post.id"']


def clean_steps(value: Any) -> list[dict[str, Any]]:  # noqa: ANN401
    """The steps as stored; raises ValidationError naming each failing index and field."""
    if not isinstance(value, list):
        raise ValidationError({"steps": ["must be a list of steps"]})
    if not value:
        raise ValidationError({"steps": ["a workflow needs at least one step"]})
    if len(value) > MAX_STEPS:
        raise ValidationError({"steps": [f"at most {MAX_STEPS} steps; this list has {len(value)}"]})
    errors: dict[str, dict[str, list[str]]] = {}
    names: set[str] = set()
    sends: set[str] = set()
    for index, step in enumerate(value):
        problems: dict[str, list[str]] = {}
        if not isinstance(step, dict):
            errors[str(index)] = {"non_field_errors": ["must be an object with `name` and `type`"]}
            continue
        name, kind = step.get("name"), step.get("type")
        if message := _text(name, MAX_NAME):
            problems["name"] = [message]
        elif name in names:
            problems["name"] = [f"{name!r} is already the name of an earlier step: names are unique in a workflow"]
        if kind not in FIELDS:
            problems["type"] = [f"must be one of {', '.join(FIELDS)}"]
        else:
            for extra in sorted(set(step) - FIELDS[kind] - {"name", "type"}):
                problems[extra] = [f"not a field of a {kind} step (those are: {', '.join(sorted(FIELDS[kind]))})"]
            if kind == "send":
                _send(step, sends, problems)
            elif kind == "delay":
                _delay(step, problems)
            elif kind == "digest":
                _window(step, problems)
            else:
                _window(step, problems)
                limit = step.get("limit")
                if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000:
                    problems["limit"] = ["must be a whole number from 1 to 1000000"]
        if isinstance(name, str):
            names.add(name)
            if kind == "send":
                sends.add(name)
        if problems:
            errors[str(index)] = problems
    if errors:
        raise ValidationError({"steps": errors})
    return [dict(step) for step in value]


def delay_until(step: dict[str, Any], timezone_name: str | None, now: datetime) -> datetime:
    """When a delay step reached at `now` ends: `seconds` later, or the next `until_local` in the
    subscriber's zone (UTC without one), DST-correct (routing.quiet_hours.next_local)."""
    if step.get("until_local"):
        return quiet_hours.next_local(step["until_local"], timezone_name, now)
    return now + timedelta(seconds=float(step["seconds"]))


def key_value(data: Any, path: str | None) -> str:  # noqa: ANN401
    """The value a dotted `path` names in the trigger's data, as text ("" for none, or no path)."""
    if not path:
        return ""
    current = data
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            return ""
        current = current[part]
    return current if isinstance(current, str) else repr(current)
