"""The SQL that writes this app's tables (events, event_outcome_batches, event_deliveries,
event_attempts, event_endpoints), in one place: the event lane's claim and record (events.deliveries),
the emitting fragments that other apps' statements compose (events.emit: the dispatcher's record
statement, receipts, suppressions), and the recovery of an endpoint's missed events (events.services).
tests/test_table_owners.py keeps them here.
"""

from __future__ import annotations

# An endpoint's missed events since %(since)s get a pending delivery again (events.services.recover):
# failed ones are reset, events it has no delivery of get one.
RECOVER = """
    INSERT INTO event_deliveries AS d (tenant_id, event_id, endpoint_id, status, attempts, next_attempt_at,
                                       last_error_code, created_at)
    SELECT ev.tenant_id, ev.id, e.id, 'pending', 0, now(), '', now()
    FROM event_endpoints e
    JOIN events ev ON ev.tenant_id = e.tenant_id AND ev.created_at >= %(since)s
    WHERE e.id = %(endpoint)s AND e.enabled AND (e.event_types ? ev.type OR e.event_types ? '*')
    ON CONFLICT (endpoint_id, event_id) DO UPDATE
        SET status = 'pending', next_attempt_at = now(), lock_token = NULL, locked_until = NULL
        WHERE d.status = 'failed'
"""


# --- emitting (events.emit) -----------------------------------------------------------------------


def _rfc3339(at: str) -> str:
    """SQL: the timestamptz `at` as RFC 3339 text in UTC with microseconds (a payload's `timestamp`)."""
    return f"""to_char({at} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def _notification_data(n: str, *, status: str, receipt: str, bounce_type: str, provider_id: str, attempt_count: str,
                       error_code: str) -> str:  # fmt: skip
    """SQL: a `notification.*` event's data (NOTIFICATION_FIELDS) for the notification row `n`
    (its id, channel and recipient_masked), the other fields given as SQL expressions; a test
    notification's also says `"test": true`."""
    return f"""(jsonb_build_object(
        'notification_id', {n}.id, 'status', {status}, 'receipt', {receipt}, 'bounce_type', {bounce_type},
        'channel', {n}.channel, 'recipient_masked', {n}.recipient_masked,
        'provider', (SELECT p.name FROM providers p WHERE p.id = {provider_id}),
        'attempt_count', {attempt_count}, 'error_code', nullif({error_code}, ''))
        || CASE WHEN {n}.test THEN '{{"test": true}}'::jsonb ELSE '{{}}'::jsonb END)"""  # noqa: S608 - callers' SQL


# Time-ordered ids (shown as evt_<hex>, events.models.public_event_id): the statement's millisecond
# (computed once) then random digits, so a batch's events sit side by side in the primary key and
# the lane's lookups of them, in creation order, touch few pages (random UUIDs cost it a page each).
_EVENT_ID_SQL = (
    "(lpad(to_hex((SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)), 12, '0')"
    " || substr(md5(random()::text), 1, 20))::uuid"
)
_SUBSCRIBED = "(e.event_types ? {type} OR e.event_types ? '*')"


def insert_events_ctes(source: str, prefix: str, *, at: str = "now()") -> str:
    """`{prefix}_new` inserts the events of `source` (columns tenant_id, type, data), made `at` (an
    SQL expression over `s`, the source's row; default the statement's now()), marked
    `fanout_pending`: the event lane's claim makes their deliveries (events.deliveries). The caller
    has already filtered `source` to tenants with a subscribed endpoint."""
    return f"""{prefix}_new AS (
        INSERT INTO events (id, tenant_id, type, payload, created_at, fanout_pending)
        SELECT {_EVENT_ID_SQL}, s.tenant_id, s.type,
               jsonb_build_object('type', s.type, 'timestamp', {_rfc3339(at)}, 'data', s.data), {at}, true
        FROM {source} s
        RETURNING id, tenant_id, type
    )"""  # noqa: S608 - this module's fragments and the caller's CTE names only; values are parameters


def outcome_batch_cte(source: str, *, prefix: str = "ob") -> str:
    """CTEs (comma-separated, no leading comma) to append to a WITH chain in which `source` is a
    CTE of updated notifications with the columns notification_id, tenant_id, provider_id,
    attempt_count, error_code and status (the new status). Its rows whose status is delivered,
    failed or dead_lettered, of tenants with an event endpoint, go into ONE `event_outcome_batches`
    row (the outbox, facts in parallel arrays): no row, index entry or JSON per event here. The
    event lane opens it into events (`open_outcomes_ctes`), for the endpoints subscribed to each
    type. Adds no statement: the batch is written by the statement that records the outcomes, in
    its transaction. `{prefix}_new` returns the row's size (`n`)."""
    return f"""{prefix}_new AS (
        INSERT INTO event_outcome_batches (tenant_ids, notification_ids, statuses, attempt_counts, provider_ids,
                                           error_codes)
        SELECT array_agg(c.tenant_id), array_agg(c.notification_id), array_agg(c.status::text),
               array_agg(c.attempt_count), array_agg(c.provider_id), array_agg(c.error_code::text)
        FROM {source} c
        WHERE c.status IN ('delivered', 'failed', 'dead_lettered')
          -- a one-time gate: with no endpoint anywhere, nothing below runs per row
          AND EXISTS (SELECT FROM event_endpoints)
          AND c.tenant_id IN (SELECT e.tenant_id FROM event_endpoints e)
        HAVING count(*) > 0
        RETURNING cardinality(notification_ids) AS n
    )"""  # noqa: S608 - constant fragments and CTE names


def open_outcomes_ctes(batches: str, *, prefix: str = "oc") -> str:
    """CTEs that turn the `event_outcome_batches` rows of `batches` (a CTE of deleted rows, all
    columns) into events marked `fanout_pending`, of the types the tenant's endpoints subscribe to
    (enabled or not, as `emit`): `notification.<status>` with the data of NOTIFICATION_FIELDS, the
    channel and recipient_masked read from the notification, the provider's name from its row, the
    `timestamp` the batch's. `{prefix}_new` returns each event's id."""
    subscribed = _SUBSCRIBED.format(type="('notification.' || u.status)")
    data = _notification_data("n", status="u.status", receipt="NULL", bounce_type="NULL", provider_id="u.provider_id",
                              attempt_count="u.attempt_count", error_code="u.error_code")  # fmt: skip
    return f"""{prefix}_src AS (
        SELECT u.tenant_id, 'notification.' || u.status AS type, {data} AS data, b.created_at AS at
        FROM {batches} b,
             unnest(b.tenant_ids, b.notification_ids, b.statuses, b.attempt_counts, b.provider_ids, b.error_codes)
                 AS u(tenant_id, notification_id, status, attempt_count, provider_id, error_code)
        JOIN notifications n ON n.id = u.notification_id
        WHERE EXISTS (SELECT FROM event_endpoints e WHERE e.tenant_id = u.tenant_id AND {subscribed})
    ), {insert_events_ctes(f"{prefix}_src", prefix, at="s.at")}"""  # noqa: S608 - constant fragments and CTE names


_EMIT_SUBSCRIBED = _SUBSCRIBED.format(type="%(type)s::text")
EMIT = f"""
    WITH emit_src AS (
        SELECT %(tenant)s::uuid AS tenant_id, %(type)s::text AS type, r.data
        FROM jsonb_array_elements(%(rows)s::jsonb) AS r(data)
        WHERE EXISTS (SELECT FROM event_endpoints e
                      WHERE e.tenant_id = %(tenant)s::uuid AND {_EMIT_SUBSCRIBED})
    ), {insert_events_ctes("emit_src", "emit")}
    SELECT 'evt_' || replace(id::text, '-', '') FROM emit_new
"""  # noqa: S608 - constant fragments only; values are bound parameters


NOTIFICATION_EVENTS = f"""
    WITH wanted AS (
        SELECT (r.item->>'notification_id')::uuid AS notification_id, r.item->>'type' AS type,
               r.item->>'receipt' AS receipt, r.item->>'bounce_type' AS bounce_type
        FROM jsonb_array_elements(%(items)s::jsonb) AS r(item)
    ), notification_src AS (
        SELECT n.tenant_id, w.type,
               {_notification_data("n", status="n.status", receipt="w.receipt", bounce_type="w.bounce_type",
                                   provider_id="n.provider_id", attempt_count="n.attempt_count",
                                   error_code="n.last_error_code")} AS data
        FROM wanted w
        JOIN notifications n ON n.id = w.notification_id
        WHERE EXISTS (SELECT FROM event_endpoints e
                      WHERE e.tenant_id = n.tenant_id AND {_SUBSCRIBED.format(type="w.type")})
    ), {insert_events_ctes("notification_src", "notification")}
    SELECT 'evt_' || replace(id::text, '-', '') FROM notification_new
"""  # noqa: S608 - constant fragments only; values are bound parameters


# --- the event lane's claim and record (events.deliveries) -------------------------------------------

CLAIM = """
    WITH due AS (
        SELECT d.id FROM event_deliveries d
        WHERE d.status = 'pending' AND d.next_attempt_at <= now()
          AND (d.locked_until IS NULL OR d.locked_until < now())
          AND EXISTS (SELECT FROM event_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
        ORDER BY d.next_attempt_at, d.id
        LIMIT %(n)s
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE event_deliveries d
        SET lock_token = %(token)s, locked_until = now() + make_interval(secs => %(lease)s),
            attempts = d.attempts + 1
        -- by primary key whatever the plan: a join with `due` was planned, generically, as a hash
        -- join over a sequential scan of the whole table (357 ms a claim at 20,000 deliveries)
        WHERE d.id = ANY(ARRAY(SELECT id FROM due))
        RETURNING d.id, d.event_id, d.endpoint_id, d.tenant_id, d.attempts, d.next_attempt_at
    ), unspread AS (
        -- the outbox: events not fanned out yet, oldest first, as many as the due deliveries left room for
        SELECT ev.id FROM events ev
        WHERE ev.fanout_pending
        ORDER BY ev.id
        LIMIT greatest(%(n)s - (SELECT count(*) FROM claimed), 0)
        FOR UPDATE SKIP LOCKED
    ), spread AS (
        UPDATE events ev SET fanout_pending = false
        WHERE ev.id = ANY(ARRAY(SELECT id FROM unspread))
        RETURNING ev.id, ev.tenant_id, ev.type
    ), fanned AS (
        -- one delivery per endpoint enabled and subscribed to the event now, leased to this claim;
        -- one that `recover` made meanwhile is left as it is
        INSERT INTO event_deliveries (tenant_id, event_id, endpoint_id, status, attempts, next_attempt_at, lock_token,
                                      locked_until, last_error_code, created_at)
        SELECT s.tenant_id, s.id, e.id, 'pending', 1, now(), %(token)s, now() + make_interval(secs => %(lease)s),
               '', now()
        FROM spread s
        JOIN event_endpoints e ON e.tenant_id = s.tenant_id AND e.enabled
                              AND (e.event_types ? s.type OR e.event_types ? '*')
        ON CONFLICT (endpoint_id, event_id) DO NOTHING
        RETURNING id, event_id, endpoint_id, tenant_id, attempts, next_attempt_at
    ), boxed AS (
        -- room left still: the oldest batch of outcomes becomes events (fanned out by the next claim)
        SELECT b.id FROM event_outcome_batches b
        WHERE (SELECT count(*) FROM claimed) + (SELECT count(*) FROM unspread) < %(n)s
        ORDER BY b.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ), opened AS (
        DELETE FROM event_outcome_batches b WHERE b.id = ANY(ARRAY(SELECT id FROM boxed))
        RETURNING b.*
    ), {OPEN}, taken AS (
        SELECT * FROM claimed UNION ALL SELECT * FROM fanned
    )
    SELECT * FROM (
        SELECT c.id, 'evt_' || replace(c.event_id::text, '-', ''), ev.type, c.endpoint_id, c.tenant_id::text,
               c.attempts, ev.payload::text, e.url, e.secret, e.previous_secret, e.secret_rotated_at, e.updated_at
        FROM taken c
        JOIN events ev ON ev.id = c.event_id
        JOIN event_endpoints e ON e.id = c.endpoint_id
        ORDER BY c.next_attempt_at, c.id
    ) claims
    UNION ALL  -- a row without a delivery: how many events the opened batch made
    SELECT NULL, NULL, NULL, NULL, NULL, (SELECT count(*) FROM oc_new)::int, NULL, NULL, NULL, NULL, NULL, NULL
    WHERE EXISTS (SELECT FROM opened)
""".replace("{OPEN}", open_outcomes_ctes("opened", prefix="oc"))


RECORD = """
    WITH r AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[], %(kinds)s::text[], %(delays)s::float8[],
                             %(statuses)s::int[], %(codes)s::text[], %(durations)s::int[], %(at)s::timestamptz[])
            AS r(id, lock_token, kind, delay, http_status, code, duration_ms, attempted_at)
    ), settled AS (
        UPDATE event_deliveries d
        SET status = CASE r.kind WHEN 'delivered' THEN 'delivered' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
            attempts = CASE WHEN r.kind = 'deferred' THEN greatest(d.attempts - 1, 0) ELSE d.attempts END,
            next_attempt_at = now() + make_interval(secs => r.delay),
            lock_token = NULL, locked_until = NULL,
            last_http_status = CASE WHEN r.kind = 'deferred' THEN d.last_http_status ELSE r.http_status END,
            last_error_code = CASE WHEN r.kind = 'deferred' THEN d.last_error_code ELSE r.code END,
            delivered_at = CASE WHEN r.kind = 'delivered' THEN now() ELSE d.delivered_at END
        FROM r
        -- fenced by the token alone (only a claim sets it; settling, recover and re-enabling clear
        -- it): a status condition here made the planner walk the whole due index instead of the pkey
        WHERE d.id = r.id AND d.lock_token = r.lock_token
        RETURNING d.id, d.tenant_id, d.event_id, d.endpoint_id, r.kind, r.http_status, r.code, r.duration_ms,
                  r.attempted_at
    ), logged AS (
        INSERT INTO event_attempts (tenant_id, event_id, endpoint_id, event_type, status, http_status, error_code,
                                    duration_ms, attempted_at)
        SELECT s.tenant_id, s.event_id, s.endpoint_id, ev.type,
               CASE WHEN s.kind = 'delivered' THEN 'delivered' ELSE 'failed' END, s.http_status, s.code,
               s.duration_ms, s.attempted_at
        FROM settled s JOIN events ev ON ev.id = s.event_id
        WHERE s.kind <> 'deferred'
    ), last_success AS (
        SELECT s.endpoint_id, max(s.attempted_at) FILTER (WHERE s.kind = 'delivered') AS at
        FROM settled s WHERE s.kind <> 'deferred' GROUP BY s.endpoint_id
    ), runs AS (
        -- failing_since after this batch: a success ends the run (a failure after it starts a new
        -- one, now); failures alone keep the run's start or start it now
        SELECT l.endpoint_id,
               CASE WHEN NOT EXISTS (SELECT FROM settled s
                                     WHERE s.endpoint_id = l.endpoint_id AND s.kind IN ('retry', 'failed')
                                       AND (l.at IS NULL OR s.attempted_at > l.at)) THEN NULL
                    WHEN l.at IS NULL THEN coalesce(e.failing_since, now())
                    ELSE now() END AS since
        FROM last_success l
        JOIN event_endpoints e ON e.id = l.endpoint_id
    ), tracked AS (
        UPDATE event_endpoints e
        SET failing_since = runs.since,
            enabled = e.enabled AND NOT coalesce(runs.since <= now() - make_interval(secs => %(disable_after)s), false),
            disabled_reason = CASE WHEN e.enabled AND runs.since <= now() - make_interval(secs => %(disable_after)s)
                                   THEN %(reason)s ELSE e.disabled_reason END,
            updated_at = CASE WHEN e.enabled AND runs.since <= now() - make_interval(secs => %(disable_after)s)
                              THEN now() ELSE e.updated_at END
        FROM runs
        WHERE e.id = runs.endpoint_id
          AND (e.failing_since IS DISTINCT FROM runs.since
               OR (e.enabled AND runs.since <= now() - make_interval(secs => %(disable_after)s)))
        RETURNING e.id, e.enabled
    ), shelved AS (
        -- a disabled endpoint's undelivered events are kept, not attempted: `recover` re-sends them
        UPDATE event_deliveries d
        SET status = 'failed', lock_token = NULL, locked_until = NULL
        FROM tracked t
        WHERE NOT t.enabled AND d.endpoint_id = t.id AND d.status = 'pending'
          AND d.id <> ALL(%(ids)s::bigint[])
          -- a one-time gate: nothing is read unless this batch disabled an endpoint
          AND EXISTS (SELECT FROM tracked WHERE NOT enabled)
    )
    SELECT id FROM settled
"""


def device_events_ctes(deactivated: str, *, prefix: str = "dd") -> str:
    """CTEs that emit `device.deactivated` for the devices of `deactivated` (a CTE of updated devices:
    id, tenant_id, subscriber_id, kind, deactivated_reason), for tenants with an endpoint subscribed to
    it: data `device_id`, `subscriber` (the external id), `kind`, `reason`. Written by the statement
    that deactivated them (the dispatcher's record), marked `fanout_pending` for the event lane."""
    subscribed = _SUBSCRIBED.format(type="'device.deactivated'")
    return f"""{prefix}_src AS (
        SELECT x.tenant_id, 'device.deactivated' AS type,
               jsonb_build_object('device_id', x.id, 'subscriber', s.external_id, 'kind', x.kind,
                                  'reason', x.deactivated_reason) AS data
        FROM {deactivated} x JOIN subscribers s ON s.id = x.subscriber_id
        WHERE EXISTS (SELECT FROM event_endpoints e WHERE e.tenant_id = x.tenant_id AND {subscribed})
    ), {insert_events_ctes(f"{prefix}_src", prefix)}"""  # noqa: S608 - constant fragments and CTE names
