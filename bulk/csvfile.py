"""Reading and checking a bulk send's CSV file, row by row, without holding the file.

The header names `recipient` (an address per row) or `subscriber` (an external id per row), and each
variable the template reads; nothing else (an unknown column is refused with the header, so a typo in
a variable's name is not sent as an empty value). Each data row (1-based, the header not counted;
blank lines are not rows) is checked: its address for the channel, or its external id's format, and
a value for every variable (a short row, or an empty cell, misses it). Subscribers are looked up
afterwards, a few thousand per query: unknown ones, and those without an address for the channel, are
errors of their rows. Preferences and suppressions are not errors: they are applied when the row's
notification is created (it is then `suppressed`).

`check()` returns the header's problems as a ValueError (the file cannot be read as a bulk send:
400), or a `Checked`: the row count, the first MAX_ERRORS errors and their total; while no row has an
error, it hands the rows to the caller in chunks of CHUNK_ROWS as they are read, so the file is never
held whole.

Through a workflow (`workflow=True`) each row is one run: the header names `subscriber` and any other
columns, which become the run's trigger `data` (text values; an empty cell is ""). A subscriber named
in two rows is an error of the later row (the job's runs are one per subscriber: they share the job's
id as trigger id), and so is a row whose data is larger than a trigger's. Unknown subscribers are not
errors: they are created, without addresses, when their run is (as a trigger creates them)."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from bulk.models import CHUNK_ROWS, MAX_ERRORS, MAX_ROWS
from core.validation import check_recipient
from recipients.models import Subscriber
from recipients.services import check_external_id
from workflows.services import MAX_DATA_BYTES, data_size

ADDRESS_COLUMNS = ("recipient", "subscriber")
MAX_CELL_CHARS = 64 * 1024
SUBSCRIBER_LOOKUP = 5000  # external ids per query
# The subscriber's address for a channel, by its masked column (plaintext, so no decryption): the
# channels a subscriber can be addressed on; in_app needs none, push may go to its devices instead.
_HAS_ADDRESS = {"email": "email_masked <> ''", "sms": "phone_masked <> ''"}


class TooManyRows(ValueError):
    """More data rows than MAX_ROWS."""


@dataclass(slots=True)
class Checked:
    columns: list[str]
    addressed_by: str  # recipient | subscriber
    rows: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0

    def error(self, row: int, column: str | None, message: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"row": row, "column": column, "message": message})


def check(
    lines: Iterable[str], *, tenant_id: Any, channel: str, variables: set[str],  # noqa: ANN401
    store: Callable[[int, list[list[Any]]], None], workflow: bool = False,
) -> Checked:  # fmt: skip
    """Check a CSV text given as lines (a text file or io.StringIO) for `channel` and a template reading
    `variables`; while no row has an error, hand each full chunk to `store(first_row, rows)` as it fills
    (the caller drops what it stored if an error comes later). Raises ValueError for a header that
    cannot work (TooManyRows past MAX_ROWS)."""
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise ValueError("the file is empty: its first line must be the header row") from None
    except csv.Error as exc:
        raise ValueError(f"the header row is not valid CSV: {exc}") from None
    columns = [name.strip().lstrip("\ufeff") for name in header]
    by = _check_workflow_header(columns) if workflow else _check_header(columns, variables)
    checked = Checked(columns=columns, addressed_by=by)
    address_at = columns.index(by)
    named = [(i, name) for i, name in enumerate(columns) if i != address_at]
    width = len(columns)
    chunk: list[list[Any]] = []
    subscribers: dict[str, list[int]] = {}
    first_seen: dict[str, int] = {}  # through a workflow: the row that names each subscriber first
    rows = _data_rows(reader)
    for number, cells in rows:
        if number > MAX_ROWS:
            raise TooManyRows(f"the file has more than {MAX_ROWS:,} data rows: split it into several bulk sends")
        checked.rows = number
        if len(cells) > width:
            checked.error(number, None, f"the row has {len(cells)} cells, the header names {width} columns")
        address = cells[address_at].strip() if address_at < len(cells) else ""
        if not address:
            checked.error(number, by, "missing: every row needs a recipient" if by == "recipient"
                          else "missing: every row needs a subscriber's external id")  # fmt: skip
        elif by == "recipient":
            try:
                check_recipient(address, channel)
            except ValueError as exc:
                checked.error(number, by, str(exc))
        else:
            try:
                check_external_id(address)
            except ValueError as exc:
                checked.error(number, by, str(exc))
            else:
                if not workflow:
                    subscribers.setdefault(address, []).append(number)
                elif address in first_seen:
                    checked.error(number, by, f"subscriber {address!r} is also in row {first_seen[address]}: a "
                                              "workflow runs once per subscriber in a bulk send")  # fmt: skip
                else:
                    first_seen[address] = number
        context = {}
        if workflow:
            _check_data(checked, number, cells, named, context)
            named_here: list[tuple[int, str]] = []
        else:
            named_here = named
        for i, name in named_here:
            value = cells[i] if i < len(cells) else None
            if value is None or not value.strip():
                checked.error(number, name, f"missing: the template uses {name!r}; give every row a value")
            elif len(value) > MAX_CELL_CHARS:
                checked.error(number, name, f"must be at most {MAX_CELL_CHARS} characters")
            else:
                context[name] = value
        if checked.error_count == 0:
            chunk.append([address, context])
            if len(chunk) == CHUNK_ROWS:
                store(number - CHUNK_ROWS + 1, chunk)
                chunk = []
        else:
            chunk = []  # an invalid file is never sent: keep nothing more
    if rows.problem is not None:
        checked.error(rows.problem[0], None, rows.problem[1])
    if subscribers:
        _check_subscribers(checked, tenant_id, channel, subscribers)
    if chunk and checked.error_count == 0:
        store(checked.rows - len(chunk) + 1, chunk)
    return checked


def _check_data(checked: Checked, number: int, cells: list[str], named: list[tuple[int, str]],
                context: dict[str, str]) -> None:  # fmt: skip
    """A workflow row's columns into `context` (its trigger data): every column needs a cell (an empty
    one is ""), each at most MAX_CELL_CHARS, the whole at most MAX_DATA_BYTES as JSON."""
    for i, name in named:
        if i >= len(cells):
            checked.error(number, name, f"missing: the row has no cell for column {name!r}")
        elif len(cells[i]) > MAX_CELL_CHARS:
            checked.error(number, name, f"must be at most {MAX_CELL_CHARS} characters")
        else:
            context[name] = cells[i]
    if (size := data_size(context)) > MAX_DATA_BYTES:
        checked.error(number, None, f"the row's data is {size} bytes as compact JSON; a run's data is at most "
                                    f"{MAX_DATA_BYTES} bytes")  # fmt: skip


class _Rows:
    """(1-based data row, cells) of the non-blank rows; stops at the first CSV syntax error and keeps it
    as `problem` (the row it was found at: what follows cannot be read reliably)."""

    def __init__(self, reader: Iterator[list[str]]) -> None:
        self.reader = reader
        self.problem: tuple[int, str] | None = None

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        number = 0
        while True:
            try:
                cells = next(self.reader)
            except StopIteration:
                return
            except csv.Error as exc:
                self.problem = (number + 1, f"not valid CSV: {exc}")
                return
            if not cells or all(not c.strip() for c in cells):
                continue
            number += 1
            yield number, cells


def _data_rows(reader: Iterator[list[str]]) -> _Rows:
    return _Rows(reader)


def _check_header(columns: list[str], variables: set[str]) -> str:
    problems = []
    if any(not name for name in columns):
        problems.append("every column needs a name in the header row")
    duplicates = sorted({name for name in columns if name and columns.count(name) > 1})
    if duplicates:
        problems.append(f"columns named twice: {', '.join(duplicates)}")
    present = [name for name in ADDRESS_COLUMNS if name in columns]
    if len(present) != 1:
        problems.append("the header must name exactly one of the columns `recipient` (an address per row) or "
                        "`subscriber` (a subscriber's external id per row)")  # fmt: skip
    missing = sorted(variables - set(columns))
    if missing:
        problems.append(f"the template uses {', '.join(missing)}: add a column for each")
    unknown = sorted(set(columns) - variables - set(ADDRESS_COLUMNS) - {""})
    if unknown:
        wanted = ", ".join(sorted(variables)) or "none"
        problems.append(f"unknown columns {', '.join(unknown)}: the header names `recipient` or `subscriber` and "
                        f"the template's variables ({wanted})")  # fmt: skip
    if problems:
        raise ValueError("; ".join(problems))
    return present[0]


def _check_workflow_header(columns: list[str]) -> str:
    problems = []
    if any(not name for name in columns):
        problems.append("every column needs a name in the header row")
    duplicates = sorted({name for name in columns if name and columns.count(name) > 1})
    if duplicates:
        problems.append(f"columns named twice: {', '.join(duplicates)}")
    if "subscriber" not in columns or "recipient" in columns:
        problems.append("through a workflow, the header names `subscriber` (a subscriber's external id per row, "
                        "one run each) and no `recipient`; the other columns become the run's data")  # fmt: skip
    if problems:
        raise ValueError("; ".join(problems))
    return "subscriber"


def _check_subscribers(checked: Checked, tenant_id: Any, channel: str, subscribers: dict[str, list[int]]) -> None:  # noqa: ANN401
    """Rows naming an unknown subscriber, or one without an address for `channel`, are errors (in row order)."""
    has_address = _HAS_ADDRESS.get(channel, "true" if channel in ("in_app", "push") else "false")
    found: dict[str, bool] = {}
    ids = list(subscribers)
    with connections[Subscriber.objects.db].cursor() as cursor:
        for start in range(0, len(ids), SUBSCRIBER_LOOKUP):
            cursor.execute(
                f"SELECT external_id, {has_address} FROM subscribers WHERE tenant_id = %s AND external_id = ANY(%s)",  # noqa: S608 - constants
                [tenant_id, ids[start : start + SUBSCRIBER_LOOKUP]],
            )
            found.update(dict(cursor.fetchall()))
    problems = []
    for external_id, rows in subscribers.items():
        if external_id not in found:
            message = f"no subscriber with external_id {external_id!r}"
        elif not found[external_id]:
            message = f"subscriber {external_id!r} has no address for channel {channel!r}"
        else:
            continue
        problems.extend((row, message) for row in rows)
    if problems:
        checked.error_count += len(problems)
        checked.errors.extend({"row": row, "column": "subscriber", "message": message} for row, message in problems)
        checked.errors.sort(key=lambda e: e["row"])
        del checked.errors[MAX_ERRORS:]
