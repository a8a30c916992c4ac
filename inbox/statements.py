"""The SQL that writes `inbox_items` (its one owner): the feed item a delivery writes, composed into
the dispatcher's record statement, and the subscriber's state changes."""

from __future__ import annotations

from django.db import connection

# Columns the record statement's `changed` CTE (notifications.statements.record_outcomes_sql) returns
# for the feed item: only an in_app notification's content travels, other channels return nulls.
# A test notification's in_app delivery is simulated: it writes no feed item (inbox_subscriber null).
RETURNING = (
    "CASE WHEN n.channel = 'in_app' AND NOT n.test THEN n.subscriber END AS inbox_subscriber, "
    "CASE WHEN n.channel = 'in_app' THEN n.category END AS inbox_category, "
    "CASE WHEN n.channel = 'in_app' THEN n.subject END AS inbox_title, "
    "CASE WHEN n.channel = 'in_app' THEN n.body END AS inbox_body, "
    "CASE WHEN n.channel = 'in_app' THEN n.push END AS inbox_fields"
)


def deliver_ctes(changed: str) -> str:
    """The record statement's inbox CTEs (`inbox_fresh`, `inbox_counted`, `inbox_new`): one feed item per
    in_app notification of `changed` that became delivered, and its subscriber's counts.

    The counts row is written first: its upsert locks the row until the commit and counts `last_seq` up
    by the subscriber's new items, which take the numbers below it (`seq`), so one subscriber's items
    commit in `seq` order whichever dispatchers write them. An item already written (a record retried
    after a lost session) is left out before counting; the unique notification_id keeps a concurrent
    second write a no-op."""
    return f"""inbox_fresh AS (
        SELECT c.tenant_id, c.inbox_subscriber AS subscriber, c.notification_id, c.inbox_category,
               c.inbox_title, c.inbox_body, c.inbox_fields,
               row_number() OVER w AS k, count(*) OVER w AS n
        FROM {changed} c
        WHERE c.channel = 'in_app' AND c.status = 'delivered' AND c.inbox_subscriber IS NOT NULL
          AND NOT EXISTS (SELECT FROM inbox_items x WHERE x.notification_id = c.notification_id)
        WINDOW w AS (PARTITION BY c.tenant_id, c.inbox_subscriber ORDER BY c.notification_id
                     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
    ), inbox_counted AS (
        INSERT INTO inbox_counts AS c (tenant_id, subscriber, unseen, unread, total, last_seq)
        SELECT tenant_id, subscriber, count(*), count(*), count(*), count(*) FROM inbox_fresh
        GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (tenant_id, subscriber) DO UPDATE
        SET unseen = c.unseen + excluded.unseen, unread = c.unread + excluded.unread,
            total = c.total + excluded.total, last_seq = c.last_seq + excluded.last_seq
        RETURNING c.tenant_id, c.subscriber, c.last_seq
    ), inbox_new AS (
        INSERT INTO inbox_items (id, tenant_id, subscriber, notification_id, category, title, body, data,
                                 action_url, created_at, seq, expires_at)
        SELECT gen_random_uuid(), f.tenant_id, f.subscriber, f.notification_id, f.inbox_category,
               coalesce(f.inbox_title, ''), coalesce(f.inbox_body, ''),
               coalesce(f.inbox_fields -> 'data', '{{}}'::jsonb), coalesce(f.inbox_fields ->> 'action_url', ''),
               now(), ct.last_seq - f.n + f.k,
               now() + make_interval(secs => (f.inbox_fields ->> 'ttl_seconds')::int)
        FROM inbox_fresh f JOIN inbox_counted ct ON ct.tenant_id = f.tenant_id AND ct.subscriber = f.subscriber
        ON CONFLICT (notification_id) DO NOTHING
        RETURNING tenant_id, subscriber
    )"""  # noqa: S608 - the caller's CTE name


_ADD_COUNTS = """
    INSERT INTO inbox_counts AS c (tenant_id, subscriber, unseen, unread, total)
    SELECT tenant_id, subscriber, {unseen}, {unread}, {total} FROM {source} GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (tenant_id, subscriber) DO UPDATE
    SET unseen = c.unseen + excluded.unseen, unread = c.unread + excluded.unread, total = c.total + excluded.total"""


# Per changed row (`d`: the item's new seen_at/read_at/archived_at and the old ones o_seen/o_read/o_arch),
# what it adds to its subscriber's counts over the items not archived.
_DELTAS = {
    "unseen": "sum((d.archived_at IS NULL AND d.seen_at IS NULL)::int - (d.o_arch IS NULL AND d.o_seen IS NULL)::int)",
    "unread": "sum((d.archived_at IS NULL AND d.read_at IS NULL)::int - (d.o_arch IS NULL AND d.o_read IS NULL)::int)",
    "total": "sum((d.archived_at IS NULL)::int - (d.o_arch IS NULL)::int)",
}


def _count_changes_sql(changed: str) -> str:
    return _ADD_COUNTS.format(source=f"{changed} d", **_DELTAS).replace(
        "SELECT tenant_id, subscriber", "SELECT d.tenant_id, d.subscriber"
    )


# --- tokens: one revocation row per subscriber ------------------------------------------------------
def token_generation(tenant_id: object, subscriber: str) -> int:
    """The subscriber's current token generation (0 until a first revocation)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generation FROM inbox_token_revocations WHERE tenant_id = %s AND subscriber = %s",
            [tenant_id, subscriber],
        )
        row = cursor.fetchone()
    return row[0] if row else 0


# (also a subquery of the stream's statements, inbox.live)
LIVE_GENERATION = """SELECT coalesce((SELECT generation FROM inbox_token_revocations
                                    WHERE tenant_id = %(tenant)s AND subscriber = %(subscriber)s), 0)
                   FROM subscribers WHERE tenant_id = %(tenant)s AND external_id = %(subscriber)s"""


def live_generation(tenant_id: object, subscriber: str) -> int | None:
    """What a token check needs, in one statement: the subscriber's token generation, or None when the
    subscriber no longer exists (its tokens die with it)."""
    with connection.cursor() as cursor:
        cursor.execute(LIVE_GENERATION, {"tenant": tenant_id, "subscriber": subscriber})
        row = cursor.fetchone()
    return row[0] if row else None


def revoke(tenant_id: object, subscriber: str) -> None:
    """Count the subscriber's generation up: every token issued in an earlier one is refused."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO inbox_token_revocations AS r (tenant_id, subscriber, generation) VALUES (%s, %s, 1)
               ON CONFLICT (tenant_id, subscriber) DO UPDATE SET generation = r.generation + 1""",
            [tenant_id, subscriber],
        )
        # the subscriber's open streams end now (inbox.live re-checks the generation when woken); the
        # key is inbox.live.subscriber_key's, as the inbox_counts trigger computes it
        cursor.execute("SELECT pg_notify('omnipost_inbox', left(md5(%s::uuid::text || ':' || %s), 8))",
                       [tenant_id, subscriber])  # fmt: skip


# --- the subscriber's state changes ---------------------------------------------------------------
ITEM_COLUMNS = ("id", "notification_id", "category", "title", "body", "data", "action_url", "created_at",
                "seen_at", "read_at", "archived_at")  # fmt: skip

# action -> the SET clause (`i` is the row; repeating an action changes nothing: coalesce keeps the first time)
_SET = {
    "seen": "seen_at = coalesce(i.seen_at, now())",
    "read": "seen_at = coalesce(i.seen_at, now()), read_at = coalesce(i.read_at, now()), "
    "first_read_at = coalesce(i.first_read_at, now())",
    "unread": "read_at = NULL",
    "archive": "archived_at = coalesce(i.archived_at, now())",
    "unarchive": "archived_at = NULL",
}
ACTIONS = tuple(_SET)
_RETURNING = ", ".join(f"i.{c}" for c in ITEM_COLUMNS)


def change(tenant_id: object, subscriber: str, item_id: object, action: str) -> tuple[dict, list[str]] | None:
    """Apply `action` to one item of the subscriber's feed (locked, then updated: one statement).
    Returns the item as it is now and the engagements it made for the first time (`seen`, `read`);
    None when the subscriber has no such item."""
    sql = f"""
        WITH old AS (
            SELECT id, seen_at, read_at, archived_at, first_read_at FROM inbox_items
            WHERE id = %s AND tenant_id = %s AND subscriber = %s FOR UPDATE
        ), changed AS (
            UPDATE inbox_items i SET {_SET[action]} FROM old WHERE i.id = old.id
            RETURNING {_RETURNING}, old.seen_at IS NULL AND i.seen_at IS NOT NULL AS first_seen,
                      old.first_read_at IS NULL AND i.first_read_at IS NOT NULL AS first_read,
                      i.tenant_id, i.subscriber, old.seen_at AS o_seen, old.read_at AS o_read,
                      old.archived_at AS o_arch
        ), counted AS ({_count_changes_sql("changed")})
        SELECT {", ".join(ITEM_COLUMNS)}, first_seen, first_read FROM changed"""  # noqa: S608 - fixed texts
    with connection.cursor() as cursor:
        cursor.execute(sql, [item_id, tenant_id, subscriber])
        row = cursor.fetchone()
    if row is None:
        return None
    item = dict(zip(ITEM_COLUMNS, row[: len(ITEM_COLUMNS)], strict=True))
    first = [name for name, flag in zip(("seen", "read"), row[len(ITEM_COLUMNS) :], strict=True) if flag]
    return item, first


# mark-all state -> (the rows it changes: not archived and not yet in that state, the SET clause)
_MARK_ALL = {
    "seen": ("i.seen_at IS NULL", _SET["seen"]),
    "read": ("i.read_at IS NULL", _SET["read"]),
    "archived": ("TRUE", _SET["archive"]),
}
MARK_ALL_STATES = tuple(_MARK_ALL)


def mark_all(tenant_id: object, subscriber: str, state: str, category: str | None) -> list[tuple[object, list[str]]]:
    """Put every not-archived item of the feed (of `category`, if given) not yet in `state` into it;
    returns (notification id, first engagements) per item changed."""
    where, assign = _MARK_ALL[state]
    sql = f"""
        WITH old AS (
            SELECT id, seen_at, read_at, archived_at, first_read_at FROM inbox_items i
            WHERE i.tenant_id = %s AND i.subscriber = %s AND i.archived_at IS NULL AND {where}
              AND (%s::text IS NULL OR i.category = %s::text)
            ORDER BY i.id
            FOR UPDATE
        ), changed AS (
            UPDATE inbox_items i SET {assign} FROM old WHERE i.id = old.id
            RETURNING i.notification_id, old.seen_at IS NULL AND i.seen_at IS NOT NULL AS first_seen,
                      old.first_read_at IS NULL AND i.first_read_at IS NOT NULL AS first_read,
                      i.tenant_id, i.subscriber, i.seen_at, i.read_at, i.archived_at, old.seen_at AS o_seen,
                      old.read_at AS o_read, old.archived_at AS o_arch
        ), counted AS ({_count_changes_sql("changed")})
        SELECT notification_id, first_seen, first_read FROM changed"""  # noqa: S608 - fixed texts
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant_id, subscriber, category, category])
        rows = cursor.fetchall()
    return [(nid, [n for n, f in zip(("seen", "read"), flags, strict=True) if f]) for nid, *flags in rows]


# --- the tenant's inbox settings --------------------------------------------------------------------
def allowed_origins(tenant_id: object) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT allowed_origins FROM inbox_settings WHERE tenant_id = %s", [tenant_id])
        row = cursor.fetchone()
    return list(row[0]) if row else []


def save_allowed_origins(tenant_id: object, origins: list[str]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO inbox_settings (tenant_id, allowed_origins) VALUES (%s, %s::varchar[])
               ON CONFLICT (tenant_id) DO UPDATE SET allowed_origins = excluded.allowed_origins""",
            [tenant_id, origins],
        )


def origin_allowed_anywhere(origin: str) -> bool:
    """Does some tenant allow `origin` (a preflight names no tenant)? A probe of inbox_settings_origins_idx."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT FROM inbox_settings WHERE allowed_origins @> ARRAY[%s]::varchar[])",
                       [origin])  # fmt: skip
        return cursor.fetchone()[0]


def counts(tenant_id: object, subscriber: str) -> dict[str, int]:
    """`GET counts`: one row (inbox_counts_one_per_subscriber), whatever the feed's size."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT unseen, unread, total FROM inbox_counts WHERE tenant_id = %s AND subscriber = %s",
                       [tenant_id, subscriber])  # fmt: skip
        row = cursor.fetchone() or (0, 0, 0)
    return {"unseen": row[0], "unread": row[1], "total": row[2]}


def recount(tenant_id: object, subscriber: str) -> None:
    """Set the subscriber's counts from its items (a repair; reads every item of the feed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO inbox_counts AS c (tenant_id, subscriber, unseen, unread, total)
               SELECT %s, %s, count(*) FILTER (WHERE seen_at IS NULL), count(*) FILTER (WHERE read_at IS NULL), count(*)
               FROM inbox_items WHERE tenant_id = %s AND subscriber = %s AND archived_at IS NULL
               ON CONFLICT (tenant_id, subscriber) DO UPDATE
               SET unseen = excluded.unseen, unread = excluded.unread, total = excluded.total""",
            [tenant_id, subscriber, tenant_id, subscriber],
        )
