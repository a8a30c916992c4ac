"""Tables other apps give to `manage.py prune` (operations.retention), in the order it empties them.

An app that keeps rows nobody needs past retention registers each table in its AppConfig.ready():
the events app its attempts, finished deliveries and events; the receipts app its de-duplication
keys. The pruner, which may not import those apps (they are its siblings or above it in the
layers), deletes the rows `condition` selects after its own work, in short batches: a range of
pages per transaction (TID range scans, so a batch never re-reads what an earlier one looked at, and
no index on the age column is needed).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetainedTable:
    table: str  # the table's name (a constant of the registering app)
    # SQL over the table's rows, `%(cutoff)s` the retention cutoff: the rows that go. It may name the
    # table to correlate a subquery (`events.id`).
    condition: str
    label: str  # what the prune summary calls its rows, e.g. "event attempt(s)"


TABLES: list[RetainedTable] = []


def register(*tables: RetainedTable) -> None:
    """Add `tables` (in order) to what prune empties; registering one twice keeps the first."""
    for table in tables:
        if all(t.table != table.table for t in TABLES):
            TABLES.append(table)


def page_delete_sql(name: str, condition: str) -> str:
    """The DELETE of one batch of prune's page ranges (operations.retention): the rows of `name` (a
    quoted identifier: a registered table, or a history partition found in the catalog; never its
    partitions, ONLY) that `condition` selects, between the tids %(lo)s and %(hi)s."""
    return f"DELETE FROM ONLY {name} WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid AND ({condition})"  # noqa: S608
