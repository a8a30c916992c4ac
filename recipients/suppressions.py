"""The suppression list: addresses a tenant's notifications must not reach.

- `suppress()` adds one entry (idempotent: one entry per tenant, channel, address and category),
  `suppress_many()` a batch in one statement (what receipts' hard bounces and complaints come to,
  through notifications.addresses), `remove()` deletes one; the API and the admin call these, audited.
- `normalise()` is the one rule for "the same address": email trimmed and lowercased, phones in
  E.164, tokens trimmed. Entries are found by the keyed blind index of the normalised address
  (`core.crypto.blind_indexes`: under every configured key, so an entry written before a key
  rotation is still found), never by decrypting the table.
- `lookup_for()` / `check_sql()` are the check the create statement folds in;
  `recompute_indexes()` rewrites every entry's index under the newest key, called by
  `rotate_encryption_keys`.
- Callbacks registered with `on_suppressed()` (the outbound events of a higher layer) are called
  with the entries a call created, in its transaction.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet

from core import crypto
from core.channels import Channel
from core.fields import Ciphertext
from core.ids import uuid7
from core.masking import mask_recipient
from core.models import AuditEvent, mode_of
from recipients.models import Suppression, SuppressionReason

logger = logging.getLogger(__name__)

MASKED_MAX = 200
# Hard bounces and complaints are about mailboxes and phone numbers, never push tokens or URLs.
ADDRESS_REASONS = (SuppressionReason.HARD_BOUNCE, SuppressionReason.COMPLAINT)
ADDRESS_CHANNELS = (Channel.EMAIL, Channel.SMS)
_PHONE_NOISE = re.compile(r"[\s().-]")

Callback = Callable[[list[Suppression]], object]
_callbacks: list[Callback] = []


def on_suppressed(callback: Callback) -> None:
    """Call `callback(created_entries)` in the transaction of every call that creates entries."""
    if callback not in _callbacks:
        _callbacks.append(callback)


def normalise(channel: str, address: str) -> str:
    """The form two spellings of one address share: what the blind index is computed over."""
    value = address.strip()
    if channel == Channel.EMAIL:
        return value.lower()
    if channel == Channel.SMS:
        value = _PHONE_NOISE.sub("", value)
        return "+" + value[2:] if value.startswith("00") else value
    return value


def indexes(channel: str, address: str) -> tuple[str, ...]:
    """The blind index of `address` on `channel` under every configured key, newest first."""
    return crypto.blind_indexes(normalise(channel, address))


@dataclass(slots=True)
class Entry:
    tenant_id: Any
    channel: str
    address: str
    reason: str
    category: str | None = None
    source_notification_id: Any = None
    test: bool = False  # an entry of test data (a test key's, or a test notification's bounce)


def _masked(channel: str, address: str) -> str:
    masked = mask_recipient(channel, address)
    return masked if len(masked) <= MASKED_MAX else masked[: MASKED_MAX - 1] + "…"


# --- adding and removing ------------------------------------------------------------------------------

_INSERT = """INSERT INTO suppressions (id, tenant_id, channel, recipient, recipient_masked, recipient_index,
                          reason, category, source_notification_id, test, created_at)
SELECT u.id, u.tenant_id, u.channel, u.recipient, u.masked, u.idx, u.reason, u.category, u.source, u.test, now()
FROM unnest(%s::uuid[], %s::uuid[], %s::varchar[], %s::text[], %s::varchar[], %s::varchar[], %s::varchar[],
            %s::varchar[], %s::uuid[], %s::bool[], %s::text[])
     AS u(id, tenant_id, channel, recipient, masked, idx, reason, category, source, test, known)
WHERE NOT EXISTS (
    -- the same entry indexed under an older key (before rotate_encryption_keys recomputed it)
    SELECT 1 FROM suppressions s
    WHERE s.tenant_id = u.tenant_id AND s.test = u.test AND s.recipient_index = ANY(string_to_array(u.known, ','))
      AND s.channel = u.channel AND s.category IS NOT DISTINCT FROM u.category)
ON CONFLICT DO NOTHING
RETURNING id, created_at"""


def suppress_many(entries: Iterable[Entry], *, actor: str | None = None) -> list[Suppression]:
    """Add entries (in the caller's transaction if any); returns those created now, in order. An
    entry that exists already (same tenant, channel, address and category), a duplicate within the
    batch, and a hard bounce or complaint on a channel other than email or SMS are skipped. One
    statement whatever the batch's size. `actor`: write one audit event per entry."""
    rows: list[tuple[Suppression, tuple[str, ...]]] = []
    for entry in entries:
        if entry.reason in ADDRESS_REASONS and entry.channel not in ADDRESS_CHANNELS:
            continue
        address = normalise(entry.channel, entry.address)
        found = crypto.blind_indexes(address)
        row = Suppression(
            id=uuid7(), tenant_id=entry.tenant_id, channel=entry.channel, recipient=address,
            recipient_masked=_masked(entry.channel, address), recipient_index=found[0],
            reason=entry.reason, category=entry.category or None,
            source_notification_id=_uuid(entry.source_notification_id), test=entry.test,
        )  # fmt: skip
        rows.append((row, found))
    if not rows:
        return []
    connection = connections[Suppression.objects.db]
    with transaction.atomic(using=connection.alias, savepoint=False):  # no error is expected to be caught here
        created = _insert(connection, rows)
        if created:
            if actor is not None:
                AuditEvent.bulk_record([_audit(actor, "suppression.created", s) for s in created])
            for callback in _callbacks:
                callback(created)
    return created


def _uuid(value: Any) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(str(value))


def _insert(connection: Any, rows: list[tuple[Suppression, tuple[str, ...]]]) -> list[Suppression]:
    field = Suppression._meta.get_field("recipient")
    columns: list[list[Any]] = [[] for _ in range(11)]
    for row, found in rows:
        token = field.get_prep_value(row.recipient)
        values = (row.id, row.tenant_id, row.channel, token, row.recipient_masked, row.recipient_index,
                  row.reason, row.category, row.source_notification_id, row.test, ",".join(found))  # fmt: skip
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    with connection.cursor() as cursor:
        cursor.execute(_INSERT, columns)
        stored = dict(cursor.fetchall())
    created = []
    for row, _ in rows:
        if row.id in stored:
            row.created_at = stored[row.id]
            row._state.adding, row._state.db = False, connection.alias
            created.append(row)
    return created


def _existing(
    tenant_id: Any, channel: str, found: Sequence[str], category: str | None, test: bool
) -> QuerySet[Suppression]:
    rows = Suppression.objects.for_tenant(tenant_id).filter(channel=channel, recipient_index__in=found, test=test)
    return rows.filter(category__isnull=True) if category is None else rows.filter(category=category)


def suppress(
    tenant_id: Any, channel: str, address: str, reason: str, category: str | None = None,
    source_notification_id: Any = None, *, actor: str | None = None,
) -> tuple[Suppression, bool]:  # fmt: skip
    """Add one entry, or find the one there is: (entry, created). A hard bounce or complaint on a
    channel other than email or SMS is refused with ValueError. `tenant_id` may be the Tenant a key
    acts for: a test key's entry is test data."""
    if reason in ADDRESS_REASONS and channel not in ADDRESS_CHANNELS:
        raise ValueError(f"a {reason} suppresses email and sms addresses only, not {channel}")
    test = mode_of(tenant_id)
    owner = getattr(tenant_id, "pk", tenant_id)
    entry = Entry(owner, channel, address, reason, category or None, source_notification_id, test)
    created = suppress_many([entry], actor=actor)
    if created:
        return created[0], True
    existing = _existing(tenant_id, channel, indexes(channel, address), category or None, test).first()
    if existing is None:  # removed again between the two statements: add it afresh
        return suppress(tenant_id, channel, address, reason, category, source_notification_id, actor=actor)
    return existing, False


def remove(tenant_id: Any, suppression_id: Any, *, actor: str) -> bool:
    """Delete one entry, audited; False when the tenant has no such entry."""
    with transaction.atomic():
        entry = Suppression.objects.for_tenant(tenant_id).select_for_update().filter(pk=suppression_id).first()
        if entry is None:
            return False
        AuditEvent.record(**_audit_args(actor, "suppression.deleted", entry))
        entry.delete()
    return True


def _audit_args(actor: str, action: str, entry: Suppression) -> dict[str, Any]:
    return {
        "actor": actor, "action": action, "target_type": "recipients.suppression", "target_id": entry.pk,
        "tenant": entry.tenant_id,
        "details": {"channel": entry.channel, "recipient_masked": entry.recipient_masked, "reason": entry.reason,
                    "category": entry.category},
    }  # fmt: skip


def _audit(actor: str, action: str, entry: Suppression) -> AuditEvent:
    args = _audit_args(actor, action, entry)
    return AuditEvent(
        actor=args["actor"], action=action, target_type=args["target_type"], target_id=str(entry.pk),
        tenant_id=entry.tenant_id, details=args["details"],
    )  # fmt: skip


# --- finding ----------------------------------------------------------------------------------------------


def matching(tenant_id: Any, address: str, channel: str | None = None) -> QuerySet[Suppression]:
    """The tenant's entries for exactly this address (as `normalise` reads it), on `channel` or any."""
    channels = [channel] if channel else list(Channel.values)
    found = {index for c in channels for index in indexes(c, address)}
    rows = Suppression.objects.for_tenant(tenant_id).filter(recipient_index__in=sorted(found))
    return rows.filter(channel=channel) if channel else rows


@dataclass(slots=True)
class Lookup:
    """What the check needs of one notification: its channel, its address's indexes (every key) and the
    category a category-scoped entry must name to block it (None: only entries for every category
    count, as for a critical category)."""

    channel: str
    indexes: tuple[str, ...]
    scope: str | None


def lookup_for(channel: str, address: str, category: str | None, *, critical: bool = False) -> Lookup:
    return Lookup(channel, indexes(channel, address), None if critical else category)


def check_sql(
    tenant_sql: str, channel_sql: str, index_sqls: Sequence[str], scope_sql: str, *, scoped_extra: str = "",
    test_sql: str = "false",
) -> str:
    """SQL that is true when an entry blocks the notification described by the given expressions: an
    entry of its mode (`test_sql`) for every category, or one for the category `scope_sql` names (and
    `scoped_extra` holds)."""
    extra = f" AND {scoped_extra}" if scoped_extra else ""
    # OFFSET 0 keeps the EXISTS a per-row probe of suppression_lookup_idx: pulled up into a semi-join,
    # the planner hashes the whole table when it is small enough to look cheap (measured: 9 ms for a
    # claim of 250 over 10,000 entries, against well under a millisecond probing).
    return (
        "EXISTS (SELECT 1 FROM suppressions s "  # noqa: S608 - column expressions of the caller, no values
        f"WHERE s.tenant_id = {tenant_sql} AND s.recipient_index IN ({', '.join(index_sqls)}) AND s.test = {test_sql} "
        f"AND s.channel = {channel_sql} AND (s.category IS NULL OR (s.category = {scope_sql}{extra})) OFFSET 0)"
    )


# The check at dispatch, for a claim's items (of any tenants): positions an entry blocks. A category
# that is critical *now* ignores category-scoped entries (it may have become critical since creation).
_CRITICAL = "EXISTS (SELECT 1 FROM categories c WHERE c.tenant_id = u.tenant_id AND c.key = u.category AND c.critical)"
# Looked at only when a category-scoped entry matches (the planner evaluates it last).
_NOT_CRITICAL = f"NOT {_CRITICAL}"


def any_for_tenant_sql(tenant_sql: str) -> str:
    """SQL that is true when the tenant `tenant_sql` has any suppression at all: one probe of
    suppression_tenant_recent_idx, so a claim learns whether its check (`dispatch_check_sql`) can
    find anything."""
    return f"EXISTS (SELECT 1 FROM suppressions s WHERE s.tenant_id = {tenant_sql} OFFSET 0)"  # noqa: S608


def dispatch_check_sql(keys: int) -> str:
    """One statement over a claim: parameters `tenants text[]` (uuids), `channels text[]`,
    `categories text[]` and one `text[]` of blind indexes per configured key; returns (position
    (0-based), blocked, critical) of the rows blocked or in a critical category (not `general`)."""
    # %b: the arrays travel in binary (psycopg's list dumpers), not as array text it must quote
    arrays = ", ".join(["%b::text[]::uuid[]", "%b::text[]", "%b::text[]", "%b::bool[]", *["%b::text[]"] * keys])
    names = ", ".join(["tenant_id", "channel", "category", "test", *[f"b{k}" for k in range(keys)], "i"])
    condition = check_sql("u.tenant_id", "u.channel", [f"u.b{k}" for k in range(keys)], "u.category",
                          scoped_extra=_NOT_CRITICAL, test_sql="u.test")  # fmt: skip
    return (
        f"SELECT i, blocked, critical FROM (SELECT u.i - 1 AS i, {condition} AS blocked, "  # noqa: S608
        f"u.category <> 'general' AND {_CRITICAL} AS critical "
        f"FROM unnest({arrays}) WITH ORDINALITY AS u({names})) x WHERE blocked OR critical"
    )


def dispatch_check_params(
    tenants: list[str], channels: list[str], addresses: list[str], categories: list[str],
    tests: list[bool] | None = None,
) -> list[Any]:
    """Parameters of `dispatch_check_sql` for rows given column by column."""
    # Once per delivery on the dispatcher's claim path: kept lean (≈ 1 µs a row with one key).
    keyed = crypto.blind_indexers()
    columns: list[list[str]] = [[] for _ in keyed]
    pairs = list(zip(keyed, columns, strict=True))
    email = Channel.EMAIL.value
    for channel, address in zip(channels, addresses, strict=True):
        if channel == email:
            value = address.strip().lower().encode()
        elif channel == "sms":
            value = normalise(channel, address).encode()
        else:
            value = address.strip().encode()
        for mac, column in pairs:
            h = mac.copy()  # type: ignore[attr-defined]
            h.update(value)
            column.append(h.digest().hex())
    return [tenants, channels, categories, tests if tests is not None else [False] * len(tenants), *columns]


# --- key rotation -----------------------------------------------------------------------------------------


def recompute_indexes(*, batch_size: int = 1000, progress: Callable[[int], object] = lambda n: None) -> int:
    """Rewrite every entry's blind index under the newest key (after a key was added; entries under an
    older one are found meanwhile anyway). Keyset-paged by id, each page one short transaction whose
    writes compare-and-set on the index read. An entry whose new index another entry already holds
    (the same address, suppressed again after the key changed) is a duplicate and is deleted.
    Returns how many entries changed or went. One statement or two per entry that changes: rotations
    are rare and the list is small next to the notifications."""
    changed_total = 0
    last_id = None
    rows = Suppression.objects.order_by("pk")
    while True:
        page_rows = rows if last_id is None else rows.filter(pk__gt=last_id)
        page = list(page_rows.values_list("pk", "channel", "recipient", "recipient_index")[:batch_size])
        if not page:
            return changed_total
        last_id = page[-1][0]
        updates: list[tuple[uuid.UUID, str, str]] = []
        for pk, channel, token, old in page:
            where = f"recipients.Suppression.recipient of row {pk}"
            new = crypto.blind_index(normalise(channel, crypto.decrypt(Ciphertext(token), where=where)))
            if new != old:
                updates.append((pk, old, new))
        with transaction.atomic():
            for pk, old, new in updates:
                twin = Suppression.objects.filter(recipient_index=new).exclude(pk=pk)
                entry = Suppression.objects.filter(pk=pk, recipient_index=old)
                current = entry.values_list("tenant_id", "channel", "category").first()
                if current is None:
                    continue
                tenant_id, channel, category = current
                twin = twin.filter(tenant_id=tenant_id, channel=channel)
                twin = twin.filter(category__isnull=True) if category is None else twin.filter(category=category)
                if twin.exists():
                    changed_total += entry.delete()[0]
                else:
                    changed_total += entry.update(recipient_index=new)
        progress(len(page))
