"""Applying receipts to notifications: one statement per call, whatever the number of receipts.

`apply_receipts(provider, receipts)` (one statement of writable CTEs; a second, which
also makes fallbacks due or cancels them, only when a receipt names a notification with a channel
fallback — the first then stores nothing):

1. reads the notifications the receipts name; those of no notification at all, of another tenant
   than the provider's, or of the tenant but sent through another of its providers (the
   notification's provider is not the one reporting, nor is the provider of any of its attempts,
   which after a failover went through another) are *ignored*: counted in `receipt_counters`
   (`/metrics`: `omnipost_receipts_ignored_total{reason="unknown"|"foreign"|"other_provider"}`),
   nothing else changes. A vendor's signature proves which provider speaks, and a provider can only
   know of what it sent: without this, one provider's signed callback could mark delivered, bounce
   and suppress what another provider of the tenant sent;
2. inserts each remaining receipt's de-duplication key (`receipt_dedup`, unique per provider)
   `ON CONFLICT DO NOTHING`: a receipt whose key is already there is a *duplicate* and changes nothing;
3. inserts the new ones as `notification_events` (receipt states and other vendor states alike);
4. raises `notifications.receipt`/`bounce_type` to the highest-ranked new receipt where it outranks
   what the notification shows (`receipts.precedence`), locking the rows in id order first.

The notifications whose receipt changed come back in `ApplyResult.changed`, and the functions in
`AFTER_APPLY` are called with them in the same transaction: the seam where a hard bounce or
complaint suppresses the address and where outbound events (`notification.bounced`, …) are emitted.
With none registered the statement runs alone, in autocommit (no BEGIN/COMMIT round trips).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from django.db import transaction

from core import hot_sql
from core.masking import mask_mapping
from notifications import fallback
from notifications import statements as notification_statements
from receipts import precedence
from receipts.inbound import BOUNCE_TYPES, RECEIPTS, ProviderView, Receipt
from receipts.models import ReceiptCounter

MAX_TYPE = 40  # notification_events.type
MAX_DEDUP_KEY = 300  # receipt_dedup.dedup_key
MAX_MESSAGE_ID = 200  # provider_messages.message_id (providers.kinds.base.MAX_PROVIDER_MESSAGE_ID)


@dataclass(frozen=True, slots=True)
class ChangedRow:
    """A notification whose `receipt` this call changed (what it shows now)."""

    notification_id: uuid.UUID
    tenant_id: uuid.UUID
    receipt: str
    bounce_type: str | None
    channel: str
    provider_id: int  # the notification's provider (the one that reported is ApplyResult.provider_id)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    provider_id: int
    applied: int = 0  # new events stored
    duplicate: int = 0  # already applied (same provider and dedup key), changed nothing
    ignored: int = 0  # unknown notification, another tenant's, or another provider's: counted, changed nothing
    changed: tuple[ChangedRow, ...] = ()
    stale: bool = False  # the provider changed since the view was read: nothing stored, read it again

    @property
    def received(self) -> int:
        return self.applied + self.duplicate + self.ignored


AfterApply = Callable[[ProviderView, ApplyResult], None]
# The seam for what follows a receipt, called (in order) once per apply that changed at least one
# notification's receipt, inside the transaction of the apply statement: (a) suppress the address of
# `changed` rows whose receipt is `complained` or `bounced` with bounce_type `hard` (email and sms
# only); (b) emit `notification.bounced` / `notification.complained` (and the rest) to
# the tenant's event endpoints. Each should cost a fixed number of statements per call.
# A hook may name the receipts it acts on (`hook.receipts`, a set of receipt values): an apply whose
# receipts hold none of them skips it, and with no hook left runs alone, in autocommit.
AFTER_APPLY: list[AfterApply] = []


def _hooks_for(rows: Sequence[_Row]) -> list[AfterApply]:
    present = {r.receipt for r in rows}
    return [hook for hook in AFTER_APPLY if present & getattr(hook, "receipts", present)]


def after_apply(provider: ProviderView, result: ApplyResult, hooks: Sequence[AfterApply] | None = None) -> None:
    for hook in AFTER_APPLY if hooks is None else hooks:
        hook(provider, result)


@dataclass(slots=True)
class _Row:
    dedup_key: str
    notification_id: uuid.UUID | None
    type: str
    receipt: str | None
    bounce_type: str | None
    occurred_at: datetime
    details: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None  # no notification id: the provider's message id names it (within the provider)

    @property
    def rank(self) -> int:
        return precedence.rank(self.receipt, self.bounce_type)


def _rows(receipts: Sequence[Receipt]) -> list[_Row]:
    """The receipts as stored: one per dedup key (the first), ids parsed (None: not a UUID, so an
    unknown notification), details masked and without NULs, values checked (an adapter's mistake is a ValueError)."""
    rows: dict[str, _Row] = {}
    for r in receipts:
        if r.receipt is not None and r.receipt not in RECEIPTS:
            raise ValueError(f"receipt must be one of {', '.join(RECEIPTS)} or None, not {r.receipt!r}")
        bounce_type = r.bounce_type if r.receipt == "bounced" else None
        if bounce_type is not None and bounce_type not in BOUNCE_TYPES:
            raise ValueError(f"bounce_type must be one of {', '.join(BOUNCE_TYPES)} or None, not {bounce_type!r}")
        if r.occurred_at.tzinfo is None:
            raise ValueError("occurred_at must be timezone-aware")
        key = r.dedup_key[:MAX_DEDUP_KEY]
        if key in rows:
            continue
        try:
            notification_id = uuid.UUID(str(r.notification_id))
        except ValueError:
            notification_id = None
        message_id = _no_nul(r.provider_message_id[:MAX_MESSAGE_ID]) if notification_id is None else ""
        rows[key] = _Row(key, notification_id, _no_nul((r.type or "")[:MAX_TYPE]), r.receipt, bounce_type,
                         r.occurred_at, _no_nul(mask_mapping(dict(r.details or {}))), message_id or None)  # fmt: skip
    return list(rows.values())


def _no_nul(value: Any) -> Any:  # noqa: ANN401
    """Without NUL characters, which PostgreSQL's text and jsonb refuse (a vendor's string may hold one)."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {_no_nul(str(k)): _no_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nul(v) for v in value]
    return value


def apply_receipts(provider: ProviderView, receipts: list[Receipt], *, using: str = "default") -> ApplyResult:
    """Apply what `provider` reported (see the module docstring): one statement."""
    rows = _rows(receipts)
    if not rows:
        return ApplyResult(provider_id=provider.id)
    hooks = _hooks_for(rows) if AFTER_APPLY else []
    if not hooks:
        return _apply(provider, rows, using)  # one statement: its own transaction
    # No savepoint inside a caller's transaction: a failure here fails the caller's transaction anyway.
    with transaction.atomic(using=using, savepoint=False):
        result = _apply(provider, rows, using)
        if result.changed:
            after_apply(provider, result, hooks)
    return result


# --- the statement ---------------------------------------------------------------------------------------

# Why each part is where it is:
# - `gate`: a view read from the per-process cache carries the provider's updated_at; if the provider
#   changed since (a rotated secret), nothing is stored and the caller verifies again with a fresh view.
# - `input` names a receipt without a notification id by the provider's message id (notifications.statements.
#   provider_message_sql: one provider_messages_pkey probe, only for such a receipt), within the reporting
#   provider only: another provider's callback naming the same message id finds nothing.
# - `found` looks each id up by itself (LATERAL … LIMIT 1, which the planner cannot flatten into a hash
#   join over the whole table: one notifications_pkey probe per receipt, whatever the
#   planner guesses of the input's size), by id alone, so another tenant's notification is told apart
#   from none (the counter's reason); `sent` says whether the reporting provider sent it: the
#   notification's own provider (no further read), else one of its attempts' providers (a failover;
#   attempt_number_unique, led by notification_id, finds its few attempts); `mine` keeps the
#   provider's tenant's that it sent.
# - `fresh` is the de-duplication: only keys this statement inserted go on (the input has one row per key).
# - `locked` takes the rows to update in id order (MATERIALIZED: a CTE with FOR UPDATE runs as written),
#   so two applies touching the same notifications cannot deadlock; the UPDATE's rank test is re-checked
#   on the row as locked (READ COMMITTED), so concurrent applies converge on the highest rank.
# - `changed`, the UPDATE of notifications, is its owner's (notifications.statements.raise_receipts_sql).
_APPLY_SQL = """
WITH gate AS (
    SELECT 1 FROM providers WHERE id = %(provider)s AND (%(version)s::timestamptz IS NULL OR updated_at = %(version)s)
),
input AS (
    SELECT i.dedup_key, coalesce(i.notification_id, {BY_MESSAGE_ID}) AS notification_id, i.type, i.receipt,
           i.bounce_type, i.occurred_at, i.details, i.rank
    FROM jsonb_to_recordset(%(rows)s::jsonb)
         AS i(dedup_key text, notification_id uuid, type text, receipt text, bounce_type text,
              occurred_at timestamptz, details jsonb, rank int, message_id text)
    WHERE EXISTS (SELECT 1 FROM gate)
),
found AS (
    SELECT i.*, n.tenant_id AS owner, n.fallback_notification_id IS NOT NULL AS linked,
           CASE WHEN n.provider_id = %(provider)s THEN true
                ELSE EXISTS (SELECT 1 FROM delivery_attempts a
                             WHERE a.notification_id = i.notification_id AND a.provider_id = %(provider)s)
           END AS sent
    FROM input i
    LEFT JOIN LATERAL (SELECT tenant_id, fallback_notification_id, provider_id FROM notifications
                       WHERE id = i.notification_id LIMIT 1) n ON true
),
go AS (
    SELECT {GO} AS ok
),
mine AS (
    SELECT * FROM found WHERE owner = %(tenant)s::uuid AND sent AND (SELECT ok FROM go)
),
fresh AS (
    INSERT INTO receipt_dedup (provider_id, dedup_key, created_at)
    SELECT %(provider)s, dedup_key, statement_timestamp() FROM mine
    ON CONFLICT DO NOTHING
    RETURNING dedup_key
),
new AS (
    SELECT m.* FROM mine m JOIN fresh f ON f.dedup_key = m.dedup_key
),
events AS (
    INSERT INTO notification_events (tenant_id, notification_id, provider_id, type, receipt, bounce_type,
                                     occurred_at, details, created_at)
    SELECT %(tenant)s::uuid, notification_id, %(provider)s, type, receipt, bounce_type, occurred_at, details,
           statement_timestamp()
    FROM new
    RETURNING 1
),
best AS (
    SELECT DISTINCT ON (notification_id) notification_id, receipt, bounce_type, rank
    FROM new WHERE receipt IS NOT NULL
    ORDER BY notification_id, rank DESC
),
locked AS MATERIALIZED (
    SELECT n.id FROM notifications n JOIN best b ON b.notification_id = n.id
    WHERE n.tenant_id = %(tenant)s::uuid
    ORDER BY n.id
    FOR UPDATE OF n
),
changed AS ({CHANGED}
),
{FALLBACK},
ignored AS (
    INSERT INTO receipt_counters (shard, provider_id, reason, count)
    SELECT pg_backend_pid() %% {SHARDS}, %(provider)s,
           CASE WHEN owner IS NULL THEN 'unknown' WHEN owner <> %(tenant)s::uuid THEN 'foreign'
                ELSE 'other_provider' END AS reason, count(*)
    FROM found WHERE (owner IS DISTINCT FROM %(tenant)s::uuid OR NOT sent) AND (SELECT ok FROM go)
    GROUP BY reason
    ON CONFLICT (shard, provider_id, reason) DO UPDATE SET count = receipt_counters.count + EXCLUDED.count
)
SELECT EXISTS (SELECT 1 FROM gate),
       (SELECT count(*) FROM input),
       (SELECT count(*) FROM mine),
       (SELECT count(*) FROM events),
       (SELECT coalesce(json_agg(json_build_array(id, tenant_id, receipt, bounce_type, channel, provider_id)), '[]')
        FROM changed),
       (SELECT count(*) FROM fb_ring),
       (SELECT ok FROM go)
"""
_APPLY_SQL = (
    _APPLY_SQL.replace(
        "{CHANGED}",
        notification_statements.raise_receipts_sql(
            "best", "locked", "{" + ",".join(precedence.ORDER) + "}", fallback.RETURNING
        ),
    )
    .replace("{SHARDS}", str(ReceiptCounter.SHARDS))
    .replace("{BY_MESSAGE_ID}", notification_statements.provider_message_sql("%(provider)s", "i.message_id"))
)
# With channel fallback (notifications.fallback): its CTEs after `changed`, for every receipt.
_APPLY_LINKED_SQL = (
    _APPLY_SQL.replace("{FALLBACK}", fallback.receipt_ctes("changed"))
    .replace("{GO}", "true")
)
# Without: stores nothing (`ok` false) if a receipt names a notification of the tenant that has a
# fallback, and the caller runs _APPLY_LINKED_SQL instead. A notification gets its fallback when it is
# created or never, so the test cannot go stale. The fallback CTEs never run for most receipts, but
# PostgreSQL opens their tables and indexes for every execution: ≈ 60 µs of a ≈ 250 µs statement.
_APPLY_PLAIN_SQL = (
    _APPLY_SQL.replace("{FALLBACK}", "fb_ring AS (SELECT 1 WHERE false)")
    .replace("{GO}", "NOT EXISTS (SELECT 1 FROM found WHERE owner = %(tenant)s::uuid AND sent AND linked)")
)


def _apply(provider: ProviderView, rows: list[_Row], using: str) -> ApplyResult:
    # The rows travel as one JSON array (jsonb_to_recordset): dumping nine typed arrays costs the web
    # process several times what encoding one document does.
    encoded = orjson.dumps([
        {"dedup_key": r.dedup_key, "notification_id": r.notification_id, "type": r.type, "receipt": r.receipt,
         "bounce_type": r.bounce_type, "occurred_at": r.occurred_at, "details": r.details, "rank": r.rank,
         "message_id": r.message_id}
        for r in rows
    ], default=str).decode()  # fmt: skip
    params = {
        "provider": provider.id,
        "tenant": str(provider.tenant_id),
        "version": provider.updated_at,
        "rows": encoded,
    }
    # Prepared once per connection, parameters bound on the server (core.hot_sql): planning this
    # statement and quoting its arrays would cost more than running it.
    gate, received, mine, applied, changed, _rung, ok = hot_sql.fetchone(_APPLY_PLAIN_SQL, params, using=using)
    if not ok:  # a receipt for a notification with a fallback (nothing was stored)
        gate, received, mine, applied, changed, _rung, _ = hot_sql.fetchone(_APPLY_LINKED_SQL, params, using=using)
    if not gate:
        return ApplyResult(provider_id=provider.id, stale=True)
    if isinstance(changed, str):
        changed = json.loads(changed)
    return ApplyResult(
        provider_id=provider.id, applied=applied, duplicate=mine - applied, ignored=received - mine,
        changed=tuple(
            ChangedRow(uuid.UUID(nid), uuid.UUID(tid), receipt, bounce, channel, pid)
            for nid, tid, receipt, bounce, channel, pid in changed
        ),
    )  # fmt: skip


def ignored_totals(using: str = "default") -> dict[tuple[int, str], int]:
    """(provider_id, reason) → receipts ignored, shards added up (for `/metrics`)."""
    from django.db.models import Sum

    rows = ReceiptCounter.objects.using(using).values_list("provider_id", "reason").annotate(n=Sum("count")).order_by()
    return {(pid, reason): int(n) for pid, reason, n in rows}


# The first `seen` / `read` of an in_app feed item (inbox.engagement) as the notification's events,
# through the notification's own provider (the tenant's inbox); a notification pruned since writes none.
_ENGAGEMENT_SQL = """
    INSERT INTO notification_events (tenant_id, notification_id, provider_id, type, receipt, bounce_type,
                                     occurred_at, details, created_at)
    SELECT n.tenant_id, n.id, n.provider_id, e.type, NULL, NULL, statement_timestamp(), '{}'::jsonb,
           statement_timestamp()
    FROM unnest(%s::uuid[], %s::text[]) AS e(notification_id, type)
    JOIN notifications n ON n.id = e.notification_id AND n.tenant_id = %s
"""


def record_engagement(cursor: Any, tenant_id: Any, engaged: Sequence[tuple[Any, str]]) -> None:  # noqa: ANN401
    """Write engagements `(notification id, "seen" | "read")` as notification events, in the caller's
    transaction (registered with inbox.engagement by receipts.apps)."""
    if engaged:
        cursor.execute(_ENGAGEMENT_SQL, [[str(n) for n, _ in engaged], [t for _, t in engaged], str(tenant_id)])
