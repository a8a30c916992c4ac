"""Quiet hours: when a non-critical notification created now waits until.

Pure functions of a category's window, a time zone and a clock reading; `services.build_specs`
calls `hold_until` for every draft from the cached categories and the subscriber row it reads anyway,
so holding costs no statement.

- A window is `{"start": "HH:MM", "end": "HH:MM"}` in the recipient's local wall-clock time, `end`
  exclusive; it may cross midnight (22:00–07:00); equal ends (`00:00`–`00:00`) mean none.
  A category's `null` inherits `general`'s, which is the tenant default.
- The time zone is the subscriber's `timezone`, UTC when it has none and for a plain `recipient`.
- Inside the window, the notification is held until the first instant after now at which the local
  clock shows `end`:
  - an `end` the clock skips (a DST gap, e.g. 02:30 in Europe/Berlin on the last Sunday of March) is
    the first instant after the gap (03:00 CEST);
  - an `end` the clock shows twice (the repeated hour of a fall-back night) is its first showing
    after now: the earlier one (daylight time) unless that has passed (a notification created during
    the repeated hour), then the later one.
  An explicit `scheduled_for` later than that instant is kept; an earlier one is moved to it.
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache

Window = tuple[time, time]


@lru_cache(maxsize=256)
def _parse(start: str, end: str) -> Window | None:
    begins, ends = time.fromisoformat(start), time.fromisoformat(end)
    return None if begins == ends else (begins, ends)


def window(own: dict[str, str] | None, general: dict[str, str] | None) -> Window | None:
    """The window a category's `quiet_hours` (`own`) stands for, `null` inheriting `general`'s."""
    chosen = own if own is not None else general
    if not chosen:
        return None
    return _parse(chosen["start"], chosen["end"])


@lru_cache(maxsize=1024)
def zone(name: str | None) -> tzinfo:
    """The subscriber's IANA zone; UTC for none (and for a name no longer known to this host)."""
    if not name:
        return UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return UTC


def release_at(quiet: Window | None, tz: tzinfo, now: datetime) -> datetime | None:
    """The instant the quiet window `now` falls in ends (in UTC), or None when `now` is outside it."""
    if quiet is None:
        return None
    start, end = quiet
    local = now.astimezone(tz)
    clock = local.time().replace(tzinfo=None)
    if start < end:
        if not start <= clock < end:
            return None
        day = local.date()
    elif clock >= start:  # crosses midnight, before it
        day = local.date() + timedelta(days=1)
    elif clock < end:  # crosses midnight, after it
        day = local.date()
    else:
        return None
    return _first_showing(day, end, tz, now)


def next_local(wall: str, timezone_name: str | None, now: datetime) -> datetime:
    """The next instant after `now` at which the clock of the zone (UTC for none) shows `wall`
    ("HH:MM"), in UTC: today's showing if still ahead, else tomorrow's; DST as for a window's end
    (a skipped time is the first instant after the gap; a repeated one its first showing after now)."""
    tz = zone(timezone_name)
    clock = time.fromisoformat(wall)
    today = now.astimezone(tz).date()
    for day in (today - timedelta(days=1), today, today + timedelta(days=1), today + timedelta(days=2)):
        instant = _first_showing(day, clock, tz, now)
        if instant > now:
            return instant
    raise AssertionError("a wall-clock time shows at least once within two days")  # pragma: no cover


def _first_showing(day: date, wall: time, tz: tzinfo, after: datetime) -> datetime:
    """The first instant later than `after` at which the clock of `tz` shows `wall` on `day`,
    or, when it never does (a gap), the first instant after the gap."""
    earlier = datetime.combine(day, wall, tzinfo=tz)  # fold=0: the first showing of a repeated time
    later = earlier.replace(fold=1)
    first, second = earlier.astimezone(UTC), later.astimezone(UTC)
    if first > second:  # zoneinfo reads a skipped wall time with both offsets: here they swap
        return _gap_end(second, first, tz)
    if first > after:
        return first
    return second


def _gap_end(low: datetime, high: datetime, tz: tzinfo) -> datetime:
    """The transition instant between `low` (before a gap, old offset) and `high` (after it): the
    first instant whose offset is the new one, found to the second (offsets change on whole seconds)."""
    old = low.astimezone(tz).utcoffset()
    lo, hi = 0, int((high - low).total_seconds())  # low + lo has the old offset, low + hi the new one
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (low + timedelta(seconds=mid)).astimezone(tz).utcoffset() == old:
            lo = mid
        else:
            hi = mid
    return low + timedelta(seconds=hi)


def hold_until(
    quiet: Window | None, timezone_name: str | None, now: datetime, scheduled_for: datetime | None
) -> datetime | None:
    """The `scheduled_for` a notification is created with: its own, or the end of the quiet window
    `now` falls in when that is later."""
    if quiet is None:
        return scheduled_for
    return _later(release_at(quiet, zone(timezone_name), now), scheduled_for)


def _later(release: datetime | None, scheduled_for: datetime | None) -> datetime | None:
    if release is None or (scheduled_for is not None and scheduled_for >= release):
        return scheduled_for
    return release


class Holds:
    """`hold_until` for one batch, read at one clock reading: each (window, zone) computed once,
    so a 1,000-item batch to a few time zones pays for a few, not a thousand."""

    __slots__ = ("now", "_releases")

    def __init__(self, now: datetime) -> None:
        self.now = now
        self._releases: dict[tuple[Window, str | None], datetime | None] = {}

    def hold_until(
        self, quiet: Window | None, timezone_name: str | None, scheduled_for: datetime | None
    ) -> datetime | None:
        if quiet is None:
            return scheduled_for
        key = (quiet, timezone_name)
        try:
            release = self._releases[key]
        except KeyError:
            release = self._releases[key] = release_at(quiet, zone(timezone_name), self.now)
        return _later(release, scheduled_for)
