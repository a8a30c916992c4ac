"""Categories and subscribers: the workflows the API and the admin call.

- Categories: `general` always exists (`ensure_general`; not critical, patchable, never deleted);
  saves and deletes are audited (and, through the model's signals that notifications.tenant_config
  connects, bump the tenant's configuration version, so every web process resolves the next
  create's category afresh). A category's `quiet_hours` window is checked here (`check_quiet_hours`).
- Subscribers: `clean_subscriber()` checks one body as plain functions (fast for a 1,000-row import);
  `upsert_subscribers()` stores a batch in one statement (INSERT … ON CONFLICT DO UPDATE), telling
  created from replaced rows; addresses are encrypted, with masked copies beside them for output.
"""

from __future__ import annotations

import json
import re
import zoneinfo
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Q

from core.api.errors import Conflict
from core.channels import CHANNELS
from core.ids import uuid7
from core.masking import mask_recipient
from core.models import AuditEvent, Tenant
from core.services import save_audited
from core.validation import MAX_METADATA_BYTES, FieldErrors, check_locale, check_recipient, json_size, unknown_fields
from recipients.models import GENERAL, Category, Subscriber

MAX_EXTERNAL_ID_CHARS = 200
MAX_PUSH_TOKENS = 10
MAX_DESCRIPTION_CHARS = 2000
SUBSCRIBER_FIELDS = ("external_id", "email", "phone", "push_tokens", "timezone", "locale", "preferences")
_CLOCK = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


# --- categories -----------------------------------------------------------------------------------


def ensure_general(tenant: Tenant | Any) -> Category:
    """The tenant's `general` category, stored on first use."""
    tenant_id = getattr(tenant, "pk", tenant)
    found = Category.objects.for_tenant(tenant_id).filter(key=GENERAL).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return Category.objects.create(tenant_id=tenant_id, key=GENERAL, description="Everything else.")
    except IntegrityError:  # created by a concurrent request
        return Category.objects.for_tenant(tenant_id).get(key=GENERAL)


def check_external_id(value: Any) -> str:
    """A subscriber's external id: the tenant's own user id, 1–200 printable characters without '/'."""
    if (
        not isinstance(value, str) or not 1 <= len(value) <= MAX_EXTERNAL_ID_CHARS or "/" in value
        or not value.isprintable() or value != value.strip()
    ):  # fmt: skip
        raise ValueError(
            f"must be the subscriber's external id: 1 to {MAX_EXTERNAL_ID_CHARS} printable characters, "
            "no '/' and no leading or trailing spaces"
        )
    return value


def check_quiet_hours(value: Any) -> dict[str, str] | None:
    """A category's `quiet_hours`: null (inherits general's), or start and end as HH:MM in the
    recipient's local time, `end` exclusive, crossing midnight allowed; 00:00–00:00 means none."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"start", "end"}:
        raise ValueError('must be null or {"start": "HH:MM", "end": "HH:MM"}')
    for name in ("start", "end"):
        if not isinstance(value[name], str) or not _CLOCK.fullmatch(value[name]):
            raise ValueError(f"{name} must be a time of day as HH:MM (00:00 to 23:59)")
    if value["start"] == value["end"] and value["start"] != "00:00":
        raise ValueError('start and end are equal: give {"start": "00:00", "end": "00:00"} for no quiet hours, '
                         "or null to inherit general's")
    return {"start": value["start"], "end": value["end"]}


def describe_quiet_hours(value: Any) -> str:
    """A category's window for people (admin, logs): `22:00–07:00`, `none`, or `inherits general`."""
    if value is None:
        return "inherits general"
    if value.get("start") == value.get("end"):
        return "none"
    return f"{value['start']}–{value['end']}"


def save_category(category: Category, *, actor: str, fields: Sequence[str] | None = None) -> Category:
    if category.key == GENERAL and category.critical:
        raise FieldErrors({"critical": ["the general category is never critical"]})

    def conflict(_: IntegrityError) -> Conflict:
        return Conflict(f"A category with key {category.key!r} already exists.", code="already_exists")

    return save_audited(category, actor=actor, noun="category", details={"key": category.key}, fields=fields,
                        conflict=conflict)  # fmt: skip


def delete_category(category: Category, *, actor: str) -> None:
    if category.key == GENERAL:
        raise Conflict("The general category always exists and cannot be deleted.", code="category_required")
    with transaction.atomic():
        AuditEvent.record(actor=actor, action="category.deleted", target=category, details={"key": category.key})
        category.delete()


# --- subscribers ----------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _timezones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def check_timezone(value: Any) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or value not in _timezones():
        raise ValueError("must be an IANA time zone name, e.g. Europe/Berlin or America/New_York")
    return value


@dataclass(slots=True)
class SubscriberData:
    """One checked subscriber body (a full replacement of what is stored)."""

    external_id: str
    email: str | None = None
    phone: str | None = None
    push_tokens: list[str] = field(default_factory=list)
    timezone: str = ""
    locale: str = ""
    preferences: dict[str, dict[str, bool]] = field(default_factory=dict)


def clean_subscriber(
    data: Any, *, external_id: str | None = None, categories: frozenset[str] = frozenset({GENERAL}),
    partial: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The checked fields of one body (for `partial`, only those given); raises FieldErrors.
    `external_id`: the one the URL names (the body may repeat it); `categories`: the tenant's keys."""
    if not isinstance(data, dict):
        raise FieldErrors({"non_field_errors": ["each subscriber must be a JSON object"]})
    errors = unknown_fields(data, SUBSCRIBER_FIELDS)
    clean: dict[str, Any] = {}

    def take(name: str, check: Any) -> None:
        if name not in data:
            return
        try:
            clean[name] = check(data[name])
        except ValueError as exc:
            errors.setdefault(name, []).append(str(exc))

    if external_id is None:
        if "external_id" not in data:
            errors["external_id"] = ["required"]
        take("external_id", check_external_id)
    elif "external_id" in data and data["external_id"] != external_id:
        errors["external_id"] = ["must be the one the URL names (or left out)"]
    take("email", lambda v: None if v is None else check_recipient(v.strip() if isinstance(v, str) else v, "email"))
    take("phone", lambda v: None if v is None else check_recipient(v, "sms"))
    take("push_tokens", _check_tokens)
    take("timezone", check_timezone)
    take("locale", lambda v: "" if v is None or v == "" else check_locale(v))
    take("preferences", lambda v: _check_preferences(v, categories))
    if errors:
        raise FieldErrors(errors)
    if external_id is not None:
        clean["external_id"] = external_id
    if not partial:
        clean = {**{"email": None, "phone": None, "push_tokens": [], "timezone": "", "locale": "",
                    "preferences": {}}, **clean}
    return clean


def _check_tokens(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_PUSH_TOKENS:
        raise ValueError(f"must be a list of at most {MAX_PUSH_TOKENS} push tokens (the first one is used)")
    return [check_recipient(token, "push") for token in value]


def clean_preferences(value: Any, tenant: Tenant) -> dict[str, dict[str, bool]]:  # noqa: ANN401
    """A §14 preferences mapping given on its own (the subscriber's inbox); raises FieldErrors."""
    if not isinstance(value, dict):
        raise FieldErrors({"preferences": ['must be an object {"<category>": {"<channel>": true|false}}']})
    try:
        return _check_preferences(value, category_keys(tenant))
    except ValueError as exc:
        raise FieldErrors({"preferences": [str(exc)]}) from None


def _check_preferences(value: Any, categories: frozenset[str]) -> dict[str, dict[str, bool]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError('must be an object {"<category>": {"<channel>": true|false}}')
    clean: dict[str, dict[str, bool]] = {}
    for category, channels in value.items():
        if category not in categories:
            raise ValueError(f"no category with key {category!r}: create it first (POST categories)")
        if not isinstance(channels, dict):
            raise ValueError(f"{category}: must be an object of channel → true|false")
        for channel, wanted in channels.items():
            if channel not in CHANNELS or not isinstance(wanted, bool):
                raise ValueError(f"{category}: keys must be channels ({', '.join(CHANNELS)}), values true or false")
        clean[category] = dict(channels)
    if json_size(clean) > MAX_METADATA_BYTES:
        raise ValueError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON")
    return clean


def _masked(channel: str, value: str | None) -> str:
    return mask_recipient(channel, value)[:200] if value else ""


_UPSERT = """INSERT INTO subscribers AS s (id, tenant_id, external_id, email, email_masked, phone, phone_masked,
                                   push_tokens, push_tokens_masked, timezone, locale, preferences, created_at,
                                   updated_at)
SELECT u.id, %s::uuid, u.external_id, u.email, u.email_masked, u.phone, u.phone_masked, u.push_tokens,
       u.push_tokens_masked::jsonb, u.timezone, u.locale, u.preferences::jsonb, now(), now()
FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
            %s::text[], %s::text[], %s::text[])
     AS u(id, external_id, email, email_masked, phone, phone_masked, push_tokens, push_tokens_masked, timezone,
          locale, preferences)
ON CONFLICT (tenant_id, external_id) DO UPDATE SET
    email = EXCLUDED.email, email_masked = EXCLUDED.email_masked, phone = EXCLUDED.phone,
    phone_masked = EXCLUDED.phone_masked, push_tokens = EXCLUDED.push_tokens,
    push_tokens_masked = EXCLUDED.push_tokens_masked, timezone = EXCLUDED.timezone, locale = EXCLUDED.locale,
    preferences = EXCLUDED.preferences, updated_at = now()
RETURNING s.external_id, (s.xmax = 0) AS created"""


def upsert_subscribers(tenant: Tenant, rows: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Create or replace subscribers (external ids unique within `rows`); external_id → created.
    One statement whatever the batch's size."""
    if not rows:
        return {}
    encrypt_text = Subscriber._meta.get_field("email").get_prep_value
    encrypt_json = Subscriber._meta.get_field("push_tokens").get_prep_value
    columns: list[list[Any]] = [[] for _ in range(11)]
    for row in rows:
        tokens = row["push_tokens"]
        values = (
            uuid7(), row["external_id"], encrypt_text(row["email"]), _masked("email", row["email"]),
            encrypt_text(row["phone"]), _masked("sms", row["phone"]), encrypt_json(tokens),
            json.dumps([_masked("push", t) for t in tokens]), row["timezone"], row.get("locale", ""),
            json.dumps(row["preferences"]),
        )  # fmt: skip
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    with connections[Subscriber.objects.db].cursor() as cursor:
        cursor.execute(_UPSERT, [tenant.pk, *columns])
        return dict(cursor.fetchall())


_ENSURE_SQL = """INSERT INTO subscribers (id, tenant_id, external_id, email, email_masked, phone, phone_masked,
                         push_tokens, push_tokens_masked, timezone, preferences)
SELECT s.id, %(tenant)s, s.external_id, NULL, '', NULL, '', %(no_tokens)s, '[]'::jsonb, '', '{}'::jsonb
FROM unnest(%(ids)s::uuid[], %(external_ids)s::text[]) AS s(id, external_id)
ON CONFLICT (tenant_id, external_id) DO NOTHING"""


def ensure_subscribers_sql() -> str:
    """The INSERT … ON CONFLICT DO NOTHING of `ensure_subscribers`, for a statement that composes it (a
    topic's membership add): parameters tenant, ids, external_ids (sorted, unique) and no_tokens."""
    return _ENSURE_SQL


def no_tokens() -> Any:  # noqa: ANN401
    """An empty push token list as stored (encrypted)."""
    return Subscriber._meta.get_field("push_tokens").get_prep_value([])


def ensure_subscribers(tenant: Tenant, external_ids: Sequence[str]) -> None:
    """Subscribers named for the first time (a workflow trigger, a topic) are created with no
    addresses; existing ones are left as they are. One INSERT … ON CONFLICT DO NOTHING."""
    if not external_ids:
        return
    # sorted: two triggers naming the same new subscribers insert them in one order (no deadlock)
    external_ids = sorted(set(external_ids))
    params = {"tenant": tenant.pk, "no_tokens": no_tokens(), "ids": [uuid7() for _ in external_ids],
              "external_ids": list(external_ids)}  # fmt: skip
    with connections[Subscriber.objects.db].cursor() as cursor:
        cursor.execute(_ENSURE_SQL, params)


def patch_subscriber(tenant: Tenant, external_id: str, changes: dict[str, Any]) -> Subscriber | None:
    """Change the given fields of one subscriber (None: no such subscriber)."""
    with transaction.atomic():
        subscriber = Subscriber.objects.for_tenant(tenant).select_for_update().filter(external_id=external_id).first()
        if subscriber is None:
            return None
        current = {
            "external_id": external_id, "email": subscriber.email, "phone": subscriber.phone,
            "push_tokens": subscriber.push_tokens or [], "timezone": subscriber.timezone, "locale": subscriber.locale,
            "preferences": subscriber.preferences or {},
        }  # fmt: skip
        upsert_subscribers(tenant, [{**current, **changes}])
    return Subscriber.objects.for_tenant(tenant).get(pk=subscriber.pk)


def delete_subscriber(tenant: Tenant, external_id: str, *, actor: str) -> bool:
    with transaction.atomic():
        subscriber = Subscriber.objects.for_tenant(tenant).filter(external_id=external_id).first()
        if subscriber is None:
            return False
        AuditEvent.record(actor=actor, action="subscriber.deleted", target=subscriber,
                          details={"external_id": external_id})  # fmt: skip
        subscriber.delete()
    return True


def _stored_category_keys(tenant: Tenant) -> frozenset[str]:
    return frozenset(Category.objects.for_tenant(tenant).values_list("key", flat=True))


# Where `category_keys` reads a tenant's stored category keys: the database, until the room that
# keeps a per-process copy of each tenant's configuration hands its reader in (notifications.apps).
_read_category_keys: Callable[[Tenant], frozenset[str]] = _stored_category_keys


def read_category_keys_with(reader: Callable[[Tenant], frozenset[str]]) -> None:
    global _read_category_keys
    _read_category_keys = reader


def category_keys(tenant: Tenant) -> frozenset[str]:
    """The tenant's category keys (`general` included), from this process's configuration copy."""
    return frozenset({GENERAL, *_read_category_keys(tenant)})


def fresh_category_keys(tenant: Tenant, wanted: set[str]) -> frozenset[str]:
    """`category_keys`, asking the database about keys the cached copy does not know."""
    keys = category_keys(tenant)
    if wanted - keys:
        found = Category.objects.for_tenant(tenant).filter(Q(key__in=wanted - keys)).values_list("key", flat=True)
        keys = keys | frozenset(found)
    return keys

