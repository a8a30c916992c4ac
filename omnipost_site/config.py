"""Typed reads of the environment that stop start-up with one readable line on bad input.

Settings run at import time, where a traceback is all Django would show; an operator who typed
OMNIPOST_LEASE_SECONDS=soon should instead read which variable is wrong and why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NoReturn, TypeVar

import environ
from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")


def fail(message: str) -> NoReturn:
    raise SystemExit(f"OmniPost configuration error: {message}")


def checked(load: Callable[[], T]) -> T:
    """Run a loader that raises ImproperlyConfigured; turn that into the one-line exit."""
    try:
        return load()
    except ImproperlyConfigured as exc:
        fail(str(exc))


def number(env: environ.Env, name: str, default: float, *, minimum: float = 0.0, integer: bool = False) -> float:
    raw = env.str(name, default="").strip()
    if not raw:
        return int(default) if integer else float(default)
    kind = "an integer" if integer else "a number"
    try:
        value: float = int(raw) if integer else float(raw)
    except ValueError:
        fail(f"{name} must be {kind}, got {raw!r}")
    if not math.isfinite(value) or value < minimum:
        fail(f"{name} must be {kind} >= {minimum:g}, got {raw!r}")
    return value


def choice(env: environ.Env, name: str, default: str, choices: Iterable[str], *, upper: bool = False) -> str:
    allowed = list(choices)
    value = env.str(name, default=default).strip() or default
    value = value.upper() if upper else value.lower()
    if value not in allowed:
        fail(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value
