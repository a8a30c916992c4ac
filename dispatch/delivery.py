"""The database side of delivering a batch: claim and start it, then record every outcome.

`claim_and_start` leases items and reads what the providers need in one statement; the
notification row is not written (a leased item *is* its notification's dispatch, shown to clients
as `dispatching`, see `Notification.live_status`). A notification that is no longer sendable
(cancelled, delivered, failed) comes back in `skipped`, so it is acked and never sent.

`record_outcomes` writes a whole batch's results at once: ack (DELETE … RETURNING, fenced by
lock_token), release for retries, the notifications' new statuses, one attempt row per try and
dead-letter entries, in ONE statement of writable CTEs (one round trip, one commit per batch).
Items whose lease was lost to a peer change nothing here: the peer owns them now.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import orjson
from django.conf import settings
from django.db import connections

from core import crypto, hot_sql, pooling
from dlq import statements as dlq_statements
from events.statements import device_events_ctes, outcome_batch_cte
from inbox import statements as inbox_statements
from notifications import counters, fallback, statements
from notifications.models import Status
from queueing import queue
from queueing.queue import Lease
from recipients import devices, suppressions
from routing import circuits


@dataclass(slots=True)
class DispatchLease:
    """What the dispatcher keeps of a claimed item's lease: enough to send, record, extend and give
    it back. The claim returns no more (each column is formatted by PostgreSQL and parsed here, per
    item): the items of one claim share its token, and the ids come as text, as the providers send
    them (webhook-id, payload)."""

    item_id: int
    lock_token: uuid.UUID
    provider_id: int | None
    rate_limited: bool
    notification_key: str
    tenant_key: str

    @property
    def notification_id(self) -> uuid.UUID:
        return uuid.UUID(self.notification_key)

    @property
    def tenant_id(self) -> uuid.UUID:
        return uuid.UUID(self.tenant_key)


@dataclass(slots=True)
class Prepared:
    lease: DispatchLease  # which item, notification, tenant and provider: see the properties below
    channel: str
    recipient_token: str
    subject: str
    body: str
    metadata: dict
    created_at: datetime
    attempt_number: int  # the number this try will get (all tries, across redrives)
    attempts_this_run: int  # tries since the last redrive, this one included
    opened_recipient: str | None = None  # decrypted with the rest of its claim (crypto.decrypt_many)
    category: str = "general"  # for the suppression check of the claim (dispatch.claims)
    critical: bool = False  # its category is critical (set by the check): no List-Unsubscribe
    provider_named: bool = True  # the client named the provider: it never fails over (routing.failover)
    push: dict | None = None  # its push fields (push_targets)
    # A push to a subscriber's devices (push_targets): the devices still pending; None: one recipient.
    targets: list[Target] | None = None
    any_delivered: bool = False  # some device of it accepted in an earlier try
    device_results: list[DeviceOutcome] | None = None  # how each target's send went (dispatch.sending)
    html_body: str = ""  # email: the HTML part rendered at creation ("" none)
    test: bool = False  # test data: sent to the simulator (providers.simulator), never to a provider

    @property
    def notification_key(self) -> str:
        return self.lease.notification_key

    @property
    def tenant_key(self) -> str:
        return self.lease.tenant_key

    @property
    def notification_id(self) -> uuid.UUID:
        return self.lease.notification_id

    @property
    def tenant_id(self) -> uuid.UUID:
        return self.lease.tenant_id

    @property
    def provider_id(self) -> int:
        return self.lease.provider_id  # type: ignore[return-value] - a notification's item has one

    def recipient(self) -> str:
        if self.opened_recipient is not None:
            return self.opened_recipient
        return crypto.decrypt(self.recipient_token, where=f"Notification.recipient of row {self.notification_id}")


@dataclass(slots=True)
class Target:
    """One device a push goes to in this try, and the provider that serves its kind."""

    device_id: uuid.UUID
    kind: str
    provider_id: int
    token: str  # plaintext: the device token, or the Web Push subscription's JSON
    active: bool
    held: bool = False  # every provider of its kind is open (routing.failover.route_devices): not sent now
    # its provider (not the push item's own) is rate-limited and had no token for it (dispatch.claims):
    # not sent now, tried again after this many seconds
    throttled: float | None = None


@dataclass(slots=True)
class DeviceOutcome:
    notification_id: uuid.UUID
    device_id: uuid.UUID
    status: str  # delivered | failed | deactivated | pending (a transient failure: tried again)
    code: str = ""
    reason: str | None = None  # the vendor said the token is dead: the device is deactivated with this
    # the provider it went through, or (pending) that its next try goes through (failover); None: unchanged
    provider_id: int | None = None
    # the send itself, for the counters and the breaker of the provider it went through (`sent_through`;
    # None: not sent, its device held or gone): delivered | transient_error | permanent_error
    sent_through: int | None = None
    sent_outcome: str = ""
    http_status: int | None = None


@dataclass(slots=True)
class Attempt:
    number: int
    started_at: datetime
    finished_at: datetime
    outcome: str
    error_class: str = ""
    error_code: str = ""
    error_message: str = ""
    http_status: int | None = None
    duration_ms: int = 0
    message_id: str | None = None  # the provider's id of the accepted message, if it gave one (DeliveryResult)


@dataclass(slots=True)
class Outcome:
    """What became of one claimed item. `kind` is delivered | retry | failed | dead_lettered |
    skipped (not sendable) | suppressed (its recipient is suppressed now: never sent, no attempt) |
    deferred (given back untried, e.g. on shutdown)."""

    lease: DispatchLease | Lease  # the record reads item_id and lock_token
    kind: str
    attempt: Attempt | None = None
    retry_delay: float = 0.0
    error_code: str = ""
    failure_reason: str = ""
    failure_class: str = ""
    status_code: int | None = None
    next_provider_id: int | None = None  # a retry's next try goes through this provider (failover)
    devices: list[DeviceOutcome] | None = None  # a push to devices: how each went (notification_devices)
    # A push to a raw token that the vendor called dead: (kind, the token's blind indexes, reason), so
    # that the tenant's device with that token is deactivated as a subscriber's would be.
    dead_token: tuple[str, tuple[str, ...], str] | None = None
    # A test notification the simulator accepted: the receipt it reports once this outcome is recorded.
    simulated: Any = None


@dataclass(slots=True)
class Recorded:
    ours: set[int] = field(default_factory=set)
    lost: list[Outcome] = field(default_factory=list)
    batched: int = 0  # outcomes the statement put into the event outbox (the event lane is nudged only then)
    # the breakers of the batch's providers as the statement left them (routing.circuits.RECORDED_STATES)
    breakers: dict[int, str] = field(default_factory=dict)


_FINAL_STATUS = {
    "delivered": Status.DELIVERED, "failed": Status.FAILED, "dead_lettered": Status.DEAD_LETTERED,
    "retry": Status.RETRYING, "deferred": Status.QUEUED, "suppressed": Status.SUPPRESSED,
}  # fmt: skip
_FINAL_STATUS_TEXT = {kind: status.value for kind, status in _FINAL_STATUS.items()}  # no enum lookups per item


def hot_cursor(using: str, raw_connection: Any = None):  # noqa: ANN201, ANN401
    """A psycopg cursor with server-side binding on Django's connection (or on `raw_connection`, a
    psycopg connection), for the two statements per batch of the dispatcher's hot path: parameters
    (long arrays) travel as typed values instead of being quoted into the SQL text, and the
    statements are prepared once per connection (`prepare_when_asked`)."""
    import psycopg

    if raw_connection is None:
        connection = connections[using]
        connection.ensure_connection()
        raw_connection = connection.connection
        prepare_when_asked(raw_connection)
    cursor = psycopg.Cursor(raw_connection)
    # psycopg's own (C) timestamptz loader instead of Django's Python subclass: both give aware
    # datetimes in the session's zone (UTC), and a batch carries three per item.
    cursor.adapters.register_loader("timestamptz", _fast_timestamptz_loader())
    return cursor


_ONLY_WHEN_ASKED = 2**31 - 1  # psycopg's prepare_threshold: never prepare a query on its own


def prepare_when_asked(raw_connection: Any) -> None:  # noqa: ANN401
    """Make `execute(..., prepare=True)` prepare, once, on this connection, and plan it once.

    Django turns psycopg's prepared statements off on its connections (prepare_threshold=None, for
    connection poolers) and that also ignores `prepare=True`: the claim and the record were parsed
    and analysed again for every batch (≈ 5 µs of PostgreSQL CPU per delivery). Statements that ask
    are prepared; Django's own queries still never are.

    Their generic plan is made once and kept (`plan_cache_mode = force_generic_plan`): with custom
    plans, planning the record statement's CTEs took 13–19 ms of PostgreSQL a batch (more than
    executing a batch of 1,000; pg_stat_statements with track_planning), the claim's 1–4 ms, and on
    the dispatcher's one DB thread a claim waited behind them. None of these plans depends on its
    parameters' values: arrays are looked up by primary key, and the claim reads its indexes in
    order under LIMITs (its generic plan at depth is asserted in tests/dispatch/test_fairness_processes.py).

    Only Django's connections need this. The LISTEN connection is a plain psycopg one (threshold
    5, so `prepare=True` works there) and keeps PostgreSQL's own choice of plan.

    Behind a pooler (core.pooling) nothing is prepared and no session `SET` is made: the hot
    statements pass `prepare=pooling.prepare()`, False there.
    """
    if raw_connection.prepare_threshold == _ONLY_WHEN_ASKED or pooling.pooled():
        return
    hot_sql.keep_generic_plans(raw_connection, _ONLY_WHEN_ASKED)


@lru_cache(maxsize=1)
def _fast_timestamptz_loader() -> type:
    import psycopg

    return psycopg.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, psycopg.pq.Format.TEXT)


# --- claim and start -------------------------------------------------------------------------------
def claim_and_start(
    n: int,
    *,
    lease_seconds: float | None = None,
    queues: Sequence[str] | None = None,
    lanes: dict[int, int] | None = None,
    look_for_starving: bool = True,
    using: str = "default",
    raw_connection: Any = None,  # noqa: ANN401 - an autocommit psycopg connection
    token: uuid.UUID | None = None,
    leave_out: Sequence[str] = (),
    seen: ClaimSeen | None = None,
) -> tuple[list[Prepared], list[DispatchLease]]:
    """Lease up to n items (plus lane grants) and read their notifications; none of the tenants in
    `leave_out` (the fair claim, `queue.claim_ctes`). `seen` is told what the statement read beside
    them: the claimed providers' `updated_at` and whether a suppression check is needed.
    `look_for_starving=False` skips the scan for items past the starvation threshold (the
    dispatcher looks once a second, not on every claim). `token` is the claim's lock token
    (new when None): a caller that lost its session during the claim can give back whatever the
    claim may have leased with it (`queue.release_claim`)."""
    lanes = {pid: cap for pid, cap in (lanes or {}).items() if cap > 0}
    if n <= 0 and not lanes:
        return [], []
    lease = float(settings.OMNIPOST_LEASE_SECONDS if lease_seconds is None else lease_seconds)
    starve = float(settings.OMNIPOST_STARVATION_SECONDS) if look_for_starving else None
    token = token or uuid.uuid4()
    sql, params = claim_statement(n, lease, starve, queues, lanes, token, leave_out)
    with hot_cursor(using, raw_connection) as cursor:
        cursor.execute(sql, params, prepare=pooling.prepare())
        rows = cursor.fetchall()
    prepared, skipped = [], []
    loads = _json_loads
    versions = seen.versions if seen is not None else {}
    check = False
    for item_id, provider_id, rate_limited, key, tenant_key, version, channel, *notification in rows:
        held = DispatchLease(item_id, token, provider_id, rate_limited, key, tenant_key)
        if provider_id is not None:
            versions[provider_id] = version
        if channel is None:  # the notification is no longer sendable
            skipped.append(held)
            continue
        (recipient, subject, body, metadata, created_at, count, offset, category, named, suppressing, html,
         test) = notification
        check = check or suppressing or category != "general"
        prepared.append(
            Prepared(
                held, channel, recipient, subject, body, loads(metadata) if isinstance(metadata, str) else metadata,
                created_at, count + 1, count - offset + 1, None, category=category, provider_named=named,
                html_body=html or "", test=test,
            )
        )  # fmt: skip
    for item, opened in zip(prepared, crypto.decrypt_many([p.recipient_token for p in prepared]), strict=True):
        item.opened_recipient = opened
    if seen is not None:
        seen.check_suppressions = check
    return prepared, skipped


@dataclass(slots=True)
class ClaimSeen:
    """What a claim statement read beside its items: each claimed item's provider's `updated_at` (None:
    its row is gone), so the provider cache needs no statement of its own for them
    (dispatch.providers.ProviderCache.load), and whether any item's tenant has a suppression or its
    category is not `general` (else `suppressed_among` has nothing to find: no statement)."""

    versions: dict[int, datetime | None] = field(default_factory=dict)
    check_suppressions: bool = True


def claim_statement(
    n: int, lease: float, starve: float | None, queues: Sequence[str] | None, lanes: dict[int, int], token: uuid.UUID,
    leave_out: Sequence[str] = (),
) -> tuple[str, dict[str, Any]]:
    """The dispatcher's claim (one statement): the queue's claim (`queue.claim_ctes`)
    joined to the notifications it starts. Its plan is asserted in tests/queueing/test_claim_isolation.py."""
    ctes, params = queue.claim_ctes(
        n, lease, starve, list(queues) if queues else None, lanes, token, returning=_DISPATCH_RETURNING,
        leave_out=leave_out,
    )
    sql = f"""{ctes}
        SELECT c.item_id, c.provider_id, c.rate_limited, c.notification_id::text, c.tenant_id::text, p.updated_at,
               n.channel, n.recipient, n.subject, n.body, n.metadata, n.created_at, n.attempt_count, n.attempt_offset,
               n.category, n.provider_named, {suppressions.any_for_tenant_sql("n.tenant_id")}, n.html_body, n.test
        FROM claimed c
        LEFT JOIN notifications n
          ON n.id = c.notification_id AND n.status IN ('queued', 'retrying', 'dispatching')
        -- the provider cache's check of its instances (dispatch.providers), in this statement
        LEFT JOIN providers p ON p.id = c.provider_id
        ORDER BY c.priority DESC, c.enqueued_at, c.item_id
    """
    return sql, params


_LONG_INTEGER = re.compile(r"\d{20}")  # may lie beyond 64 bits, where orjson would read a float


def _json_loads(text: str) -> Any:  # noqa: ANN401
    """A metadata document from the claim: orjson (≈ 5× quicker than the standard library, once per
    delivery), except where a run of 20 digits could be an integer orjson cannot hold exactly."""
    if _LONG_INTEGER.search(text):
        return json.loads(text)
    return orjson.loads(text)


# The claim's own columns that the dispatcher reads (and orders by); see DispatchLease.
_DISPATCH_RETURNING = "item_id, provider_id, rate_limited, notification_id, tenant_id, priority, enqueued_at"


# --- the suppression check of a claim -----------------------------------------------------------------
def suppressed_among(prepared: Sequence[Prepared], *, using: str = "default") -> set[int]:
    """Positions in `prepared` whose recipient is suppressed now (a suppression added after queueing
    wins): one statement per claim (recipients.suppressions.dispatch_check_sql),
    none for an empty claim. Items whose category is critical now get `critical = True`."""
    if not prepared:
        return set()
    tenants, channels, addresses, categories, tests, positions = [], [], [], [], [], []
    for position, item in enumerate(prepared):
        address = item.opened_recipient
        if address is None:
            try:
                address = item.recipient()
            except crypto.DecryptionError:
                continue  # unreadable: its send fails and records why (dispatch.sending)
        tenants.append(item.lease.tenant_key)
        channels.append(item.channel)
        addresses.append(address)
        categories.append(item.category)
        tests.append(item.test)
        positions.append(position)
    if not positions:
        return set()
    params = suppressions.dispatch_check_params(tenants, channels, addresses, categories, tests)
    with hot_cursor(using) as cursor:
        cursor.execute(suppressions.dispatch_check_sql(crypto.key_count()), params, prepare=pooling.prepare())
        rows = cursor.fetchall()
    blocked = set()
    for i, is_blocked, is_critical in rows:
        if is_blocked:
            blocked.add(positions[i])
        if is_critical:
            prepared[positions[i]].critical = True
    return blocked


# --- the devices of a claim's pushes ------------------------------------------------------------------

# The claim's push notifications: their push fields and, for a push to a subscriber's devices, the
# devices still pending (with each device as it is now: a device deactivated since is not sent to).
_PUSH_TARGETS = """
    SELECT u.i - 1, n.push, nd.device_id, nd.kind, nd.provider_id, d.token, coalesce(d.active, false),
           EXISTS (SELECT 1 FROM notification_devices x WHERE x.notification_id = u.id) AS fanout,
           EXISTS (SELECT 1 FROM notification_devices x WHERE x.notification_id = u.id AND x.status = 'delivered')
    FROM unnest(%s::uuid[]) WITH ORDINALITY AS u(id, i)
    JOIN notifications n ON n.id = u.id
    LEFT JOIN notification_devices nd ON nd.notification_id = u.id AND nd.status = 'pending'
    LEFT JOIN devices d ON d.id = nd.device_id
    ORDER BY u.i, nd.id
"""


def push_targets(prepared: Sequence[Prepared], *, using: str = "default") -> set[int]:
    """Fill in the push fields and the pending devices of the claim's push items (one statement, none
    without a push item); returns the providers their devices go through."""
    pushes = [(i, p) for i, p in enumerate(prepared) if p.channel == "push"]
    if not pushes:
        return set()
    with hot_cursor(using) as cursor:
        cursor.execute(_PUSH_TARGETS, [[p.notification_key for _, p in pushes]], prepare=pooling.prepare())
        rows = cursor.fetchall()
    providers: set[int] = set()
    tokens: list[str] = []
    waiting: list[Target] = []
    for position, push, device_id, kind, provider_id, token, active, fanout, delivered in rows:
        item = pushes[position][1]
        item.push = _json_loads(push) if isinstance(push, str) else push
        if not fanout:
            continue
        if item.targets is None:
            item.targets, item.any_delivered = [], delivered
        if device_id is None:
            continue
        target = Target(device_id, kind, provider_id, "", bool(active) and token is not None)
        item.targets.append(target)
        if target.active:
            providers.add(provider_id)
            tokens.append(token)
            waiting.append(target)
    for target, token, opened in zip(waiting, tokens, crypto.decrypt_many(tokens), strict=True):
        target.token = (
            opened if opened is not None else crypto.decrypt(token, where=f"Device.token of {target.device_id}")
        )
    return providers


# A device that accepted while its push's other devices are still being sent to, written at once (fenced
# by the item's lease): a dispatcher that dies before the push's outcome is recorded leaves it
# `delivered`, so the next try (after the lease) does not send it again.
_ACCEPTED_SQL = f"""
    WITH w AS (
        SELECT v.*, 'delivered'::text AS status, ''::text AS code
        FROM unnest(%s::bigint[], %s::uuid[], %s::uuid[], %s::uuid[], %s::bigint[])
             AS v(item_id, lock_token, notification_id, device_id, provider_id)
        WHERE EXISTS (SELECT 1 FROM queue_state q WHERE q.item_id = v.item_id AND q.lock_token = v.lock_token)
    ), done AS ({statements.record_devices_sql("w")}
    ), used AS ({devices.used_sql("w")})
    SELECT count(*) FROM done"""  # noqa: S608 - fragments of the tables' owners


def record_accepted(
    accepted: Sequence[tuple[DispatchLease, uuid.UUID, int | None]], *, using: str = "default"
) -> int:
    """Devices that accepted their push, before the push's outcome: (lease, device id, the provider it
    went through) each; one statement."""
    if not accepted:
        return 0
    params = [[lease.item_id for lease, _, _ in accepted], [lease.lock_token for lease, _, _ in accepted],
              [lease.notification_id for lease, _, _ in accepted], [device for _, device, _ in accepted],
              [provider for _, _, provider in accepted]]  # fmt: skip
    with hot_cursor(using) as cursor:
        cursor.execute(_ACCEPTED_SQL, params, prepare=pooling.prepare())
        return cursor.fetchone()[0]


# --- record -----------------------------------------------------------------------------------------
def record_outcomes(outcomes: Sequence[Outcome], *, using: str = "default") -> Recorded:
    """Write a batch's results atomically; returns the items that were still ours and those lost."""
    if not outcomes:
        return Recorded()
    ours, batched, breakers = _record(outcomes, using)
    lost = [o for o in outcomes if o.lease.item_id not in ours]
    return Recorded(ours=ours, lost=lost, batched=batched, breakers=breakers)


# Placeholders are %(…)b: the long arrays travel in binary (psycopg's own list dumpers), not as array text.
# Every per-item column travels in the one `outcome` unnest (an item's attempt and dead letter, null
# where it has none) and comes back through the queue's RETURNING in `ours`: no CTE is joined with
# another. The dispatcher keeps one generic plan of this statement (prepare_when_asked), which
# estimates every unnest at 10 rows; a join of two such inputs was planned as a nested loop over
# the other one, 1,000 × 1,000 rows a batch (≈ 800 ms instead of 40).
_OUTCOME_COLUMNS = (
    ("item_id", "bigint"), ("lock_token", "uuid"), ("kind", "text"), ("delay", "float8"), ("status", "text"),
    ("attempts", "int"), ("code", "text"), ("next_provider", "bigint"),
    ("a_number", "int"), ("a_started", "timestamptz"), ("a_finished", "timestamptz"), ("a_outcome", "text"),
    ("a_class", "text"), ("a_code", "text"), ("a_message", "text"), ("a_status", "int"), ("a_duration", "int"),
    ("a_provider", "bigint"), ("a_message_id", "text"),
    ("d_class", "text"), ("d_reason", "text"), ("d_status_code", "int"), ("d_count", "int"),
)  # fmt: skip
_OURS = ("q.item_id, q.notification_id, q.tenant_id, q.provider_id, o.status, o.attempts, o.code, o.a_number, "
         "o.a_started, o.a_finished, o.a_outcome, o.a_class, o.a_code, o.a_message, o.a_status, o.a_duration, "
         "o.a_provider, o.a_message_id, o.d_class, o.d_reason, o.d_status_code, o.d_count")  # fmt: skip
_RECORD_SQL = """
    WITH outcome AS (
        SELECT * FROM unnest({arrays}) AS o({names})
    ), settling AS (
        -- what the queue does with each item (queue.settle_ctes): the ack kinds leave it; a retry's next
        -- try may go through another provider (failover, routing.failover)
        SELECT o.*, next_provider AS provider_id,
               CASE WHEN kind IN ('delivered', 'failed', 'dead_lettered', 'skipped', 'suppressed') THEN 'ack'
                    WHEN kind = 'deferred' THEN 'refund' ELSE 'release' END AS settle
        FROM outcome o
    ), {settle}, ours AS (
        SELECT * FROM acked UNION ALL SELECT * FROM released
    ), changed AS ({changed}
    ), {outbox}, {fallback}, attempts AS ({attempts}
    ), dead AS ({dead}
    ), messages AS ({messages}
    ), dev_in AS (
        -- a push's devices (notification_devices), for the items still ours: each device's result; the
        -- devices the vendor called dead deactivated, with their device.deactivated events; last_used_at
        -- (one JSON array of DeviceOutcome objects: serialised in C by orjson, where nine arrays were
        -- dumped element by element in Python on the dispatcher's DB thread)
        SELECT v.* FROM json_to_recordset(%(devices)s::json)
                        AS v(notification_id uuid, device_id uuid, status text, code text, reason text,
                             provider_id bigint, sent_through bigint, sent_outcome text, http_status int)
        WHERE v.notification_id IN (SELECT notification_id FROM ours)
    ), sends AS (
        -- what each provider was sent, for its counters and its breaker: an item's attempt, or for a
        -- push to devices each device's send, through the provider it went through (so a failing APNs
        -- provider's breaker opens, not that of the provider the push item was on; a device held or
        -- gone was not sent)
        SELECT a.provider_id, a.outcome, a.http_status, a.error_class FROM attempts a
        WHERE NOT EXISTS (SELECT 1 FROM dev_in d WHERE d.notification_id = a.notification_id)
        UNION ALL
        SELECT d.sent_through, d.sent_outcome, d.http_status, NULL FROM dev_in d WHERE d.sent_through IS NOT NULL
    ), counted AS ({counted}
    ), dev_raw_in AS (
        -- pushes to a raw token the vendor called dead: the tenant's device with that token, if it has one
        SELECT v.* FROM unnest(%(rd_notification)s::uuid[], %(rd_tenant)s::uuid[], %(rd_kind)s::text[],
                               %(rd_index)s::text[], %(rd_reason)s::text[])
                        AS v(notification_id, tenant_id, kind, token_index, reason)
        WHERE v.notification_id IN (SELECT notification_id FROM ours)
    ), dev_gone AS (
        SELECT device_id, reason FROM dev_in UNION ALL {dev_by_token}
    ), dev_results AS ({dev_results}
    ), dev_dead AS ({dev_dead}
    ), dev_used AS ({dev_used}
    ), {inbox}, {dev_events}, {circuit}
    SELECT item_id, (SELECT coalesce(sum(n), 0) FROM ob_new)::int, (SELECT count(*) FROM fb_ring)::int,
           {breakers}
    FROM ours
""".format(
    arrays=", ".join(f"%({name})b::{kind}[]" for name, kind in _OUTCOME_COLUMNS),
    names=", ".join(name for name, _ in _OUTCOME_COLUMNS),
    # the queue row gives back the ids the rest of the statement needs (and each item's outcome
    # beside them): the batch carries only what the queue row does not know
    settle=queue.settle_ctes("settling", returning=_OURS, reroute=True),
    # the event outbox: delivered / failed / dead_lettered outcomes of tenants with an event endpoint, one
    # event_outcome_batches row (events.statements), which the event lane opens into notification.* events
    outbox=outcome_batch_cte("changed"),
    # channel fallback (notifications.fallback): accepted → the fallback is due after_seconds later,
    # failed / dead-lettered → now, suppressed → cancelled
    # the notifications' new statuses, their attempts (notifications.statements)
    changed=statements.record_outcomes_sql("ours", f"{fallback.RETURNING}, {inbox_statements.RETURNING}"),
    attempts=statements.insert_attempts_sql("ours"),
    # (provider, the provider's message id) → notification, for receipts that name only the message id
    # (receipts.vendors.ses); only rows whose send returned one (a webhook's never does)
    messages=statements.insert_provider_messages_sql("ours"),
    fallback=fallback.record_ctes("changed"),
    # the providers' breakers (routing.circuits): read and written only for a provider whose
    # batch had a transient failure or whose breaker is not closed
    circuit=circuits.record_ctes("sends", counters.breaker_totals_sql),
    breakers=circuits.RECORDED_STATES,
    # /metrics' counters (notifications.counters) and the dead letters (dlq.statements)
    counted=counters.add_sql("sends", "changed"),
    dead=dlq_statements.insert_dead_letters_sql("ours"),
    dev_results=statements.record_devices_sql("dev_in"),
    dev_by_token=devices.by_token_sql("dev_raw_in"),
    dev_dead=devices.deactivate_sql("dev_gone"),
    dev_used=devices.used_sql("dev_in"),
    dev_events=device_events_ctes("dev_dead"),
    # an in_app notification's delivery is its feed item (inbox.statements)
    # (and the subscribers' unseen / unread / total, and the items' places in their feeds)
    inbox=inbox_statements.deliver_ctes("changed"),
)


def _record(outcomes: Sequence[Outcome], using: str) -> tuple[set[int], int, dict[int, str]]:
    with hot_cursor(using) as cursor:
        cursor.execute(*record_statement(outcomes), prepare=pooling.prepare())
        rows = cursor.fetchall()
        if not rows:
            return set(), 0, {}
        return {row[0] for row in rows}, rows[0][1], circuits.recorded_states(rows[0][3], rows[0][4])


def record_statement(outcomes: Sequence[Outcome]) -> tuple[str, dict[str, Any]]:
    """The record statement of a batch, and its parameters."""
    tried = [o.attempt for o in outcomes]
    dead = [o if o.kind in ("failed", "dead_lettered") else None for o in outcomes]
    params: dict[str, Any] = {
        "item_id": [o.lease.item_id for o in outcomes],
        "lock_token": [o.lease.lock_token for o in outcomes],
        "kind": [o.kind for o in outcomes],
        "delay": [o.retry_delay for o in outcomes],
        "status": [_FINAL_STATUS_TEXT.get(o.kind, "") for o in outcomes],
        "attempts": [o.attempt.number if o.attempt else -1 for o in outcomes],
        "code": [o.error_code for o in outcomes],
        "next_provider": [o.next_provider_id for o in outcomes],
        "a_number": [a.number if a else None for a in tried],
        "a_started": [a.started_at if a else None for a in tried],
        "a_finished": [a.finished_at if a else None for a in tried],
        "a_outcome": [a.outcome if a else None for a in tried],
        "a_class": [a.error_class if a else None for a in tried],
        "a_code": [a.error_code if a else None for a in tried],
        "a_message": [a.error_message if a else None for a in tried],
        "a_status": [a.http_status if a else None for a in tried],
        "a_duration": [a.duration_ms if a else None for a in tried],
        # the provider it went through (routing may change it), for its attempt and its dead letter
        "a_provider": [o.lease.provider_id for o in outcomes],
        "a_message_id": [a.message_id if a else None for a in tried],
        "d_class": [d.failure_class if d else None for d in dead],
        "d_reason": [d.failure_reason[:2000] if d else None for d in dead],
        "d_status_code": [d.status_code if d else None for d in dead],
        "d_count": [(d.attempt.number if d.attempt else 0) if d else None for d in dead],
    }
    # every field of each DeviceOutcome, by its name (json_to_recordset in dev_in reads the ones it names)
    params["devices"] = orjson.dumps([r for o in outcomes if o.devices for r in o.devices]).decode()
    dead_tokens = [(o.lease, o.dead_token, index) for o in outcomes if o.dead_token for index in o.dead_token[1]]
    params["rd_notification"] = [lease.notification_id for lease, _, _ in dead_tokens]
    params["rd_tenant"] = [lease.tenant_id for lease, _, _ in dead_tokens]
    params["rd_kind"] = [dead[0] for _, dead, _ in dead_tokens]
    params["rd_index"] = [index for _, _, index in dead_tokens]
    params["rd_reason"] = [dead[2] for _, dead, _ in dead_tokens]
    return _RECORD_SQL, params
