"""A provider's circuit breaker as its row and the API show it: the settings a client stores in the
provider's `circuit` column (`failure_threshold`, `min_requests`, `window_seconds`, `open_seconds`),
their defaults, and the names of the breaker's states. How a breaker moves between its states, and
where that state is kept, is routing's (routing/breaker.py, routing/circuits.py)."""

from __future__ import annotations

from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)
CIRCUIT_DEFAULTS: dict[str, float] = {
    "failure_threshold": 0.5, "min_requests": 20, "window_seconds": 60.0, "open_seconds": 30.0,
}  # fmt: skip
_LIMITS = {
    "failure_threshold": (0.0, 1.0), "min_requests": (1, 1_000_000), "window_seconds": (0.1, 86_400.0),
    "open_seconds": (0.1, 86_400.0),
}  # fmt: skip


def validate_circuit(value: Any) -> dict[str, float]:  # noqa: ANN401 - JSON from the client
    """The settings a client may store (only known keys, numbers in range); raises ValueError."""
    if not isinstance(value, dict):
        raise ValueError("circuit must be an object")
    unknown = sorted(set(value) - set(CIRCUIT_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown circuit settings: {', '.join(unknown)} (known: {', '.join(CIRCUIT_DEFAULTS)})")
    clean: dict[str, float] = {}
    for key, raw in value.items():
        low, high = _LIMITS[key]
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not low <= raw <= high:
            raise ValueError(f"circuit.{key} must be a number from {low} to {high}")
        if key == "min_requests" and int(raw) != raw:
            raise ValueError("circuit.min_requests must be an integer")
        clean[key] = int(raw) if key == "min_requests" else float(raw)
    return clean


def settings_of(circuit: dict[str, Any] | None) -> dict[str, float]:
    return {**CIRCUIT_DEFAULTS, **(circuit or {})}


def setting_sql(alias: str, key: str) -> str:
    """A provider's circuit setting in SQL (`alias` is a `providers` row), its default when unset."""
    return f"coalesce(({alias}.circuit ->> '{key}')::float8, {float(CIRCUIT_DEFAULTS[key])!r})"
