"""Notification workflows every door uses (API single and batch, sequences, benchmarks).

- `build_specs()` resolves checked drafts against the tenant's providers and templates (cached
  per process, see notifications.tenant_config: no query once warm), renders templates and holds
  what is created inside its quiet hours until they end (routing.quiet_hours);
- `create_notifications()` stores them in one statement whatever the batch size, with the
  Idempotency-Key record when there is one;
- `cancel_notification()` / `cancel_scheduled_job()` are conditional updates.

Lock order, shared with the scheduler and the dispatcher so they cannot deadlock:
scheduled_jobs → notifications → queue_state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Q
from django.db.models.base import ModelState
from django.db.models.functions import Now
from django.utils import timezone
from rest_framework.exceptions import NotFound

from core import crypto, hot_sql, tracing
from core.api.errors import Conflict
from core.grouping import GroupRunner
from core.ids import uuid7
from core.masking import mask_recipient
from core.models import AuditEvent, Tenant, mode_of
from core.validation import FieldErrors
from notifications import fallback, statements, tenant_config
from notifications.models import CANCELLABLE, IdempotencyRecord, Notification, Status, TenantQueue
from notifications.validation import DEFAULT_QUEUE, Draft
from providers.kinds import push
from providers.models import Provider
from providers.services import ensure_inbox_provider
from queueing import queue
from queueing.models import DEFAULT_JOB_KIND, ScheduledJob
from queueing.queue import NOTIFY_CHANNEL, insert_items_sql, ring_after_commit
from queueing.schedule import cancel_jobs_for, insert_jobs_sql, ring_schedulers
from recipients import devices, suppressions
from recipients.models import GENERAL, Category, Subscriber
from routing import quiet_hours
from templating import rendering
from templating.models import Template

logger = logging.getLogger(__name__)

MASKED_MAX = 200  # Notification.recipient_masked max_length


class SpecErrors(Exception):
    """Per-index field errors found while resolving drafts: {index: {field: [messages]}}."""

    def __init__(self, errors: dict[int, dict[str, list[str]]]) -> None:
        super().__init__(errors)
        self.errors = errors


@dataclass(slots=True)
class NotificationSpec:
    """A notification ready to store: provider resolved, template rendered, recipient checked."""

    channel: str
    recipient: str
    provider: Provider
    subject: str = ""
    body: str = ""
    html_body: str = ""  # email from a template with an HTML body
    template: Template | None = None
    template_version: int | None = None  # the version rendered (the template's at resolve time)
    locale: str | None = None  # the variant's tag (templating.rendering); None: the template's own fields
    context: dict[str, Any] = field(default_factory=dict)
    priority: int = 5
    queue: str = "default"
    scheduled_for: datetime | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    category: str = "general"
    subscriber: str | None = None  # the external id the recipient was resolved from
    # A critical category ignores opt-outs and category-scoped suppressions, never those for every category.
    critical: bool = False
    # Decided before the create (a subscriber's opt-out): stored `suppressed`, never queued.
    opted_out: bool = False
    # False when the provider came from the channel's failover order (or default): it may fail over.
    provider_named: bool = True
    # The tenant's config_version the provider and template were read at (build_specs from the
    # cache): the create stores only while it is still current, else raises StaleConfig.
    config_version: int | None = None
    # Channel fallback (notifications.fallback): the linked notification on the next channel, stored
    # `scheduled` (without a job) beside this one; `fallback_steps` is the chain as the client gave it.
    fallback: NotificationSpec | None = None
    fallback_steps: list[dict[str, Any]] | None = None
    push: dict[str, Any] | None = None  # the push fields (providers.kinds.push)
    # A push to a subscriber through the native kinds: (device id, kind, the provider serving that kind)
    # of each active device it goes to, stored beside it (notification_devices).
    devices: list[tuple[uuid.UUID, str, Provider]] | None = None
    # The bulk send and its 1-based data row this notification comes from (bulk.engine), if any.
    bulk_send_id: uuid.UUID | None = None
    bulk_row: int | None = None


class StaleConfig(Exception):
    """The tenant's providers or templates changed since the specs were resolved: resolve again."""


class IdempotencyKeyTaken(Exception):
    """The Idempotency-Key already has a record (`in_progress`: a request holding it is running now)."""

    def __init__(self, *, in_progress: bool) -> None:
        super().__init__("in progress" if in_progress else "taken")
        self.in_progress = in_progress


@dataclass(slots=True)
class IdempotentResponse:
    """The Idempotency-Key record a create stores in the same statement as its notifications: the
    response is rendered (by `render`, from the rows about to be stored) before anything is written,
    so notifications are never committed without the response that replays them. An expired
    record, or an `in_flight` one older than `abandoned_before` (written by earlier versions), is
    taken over."""

    key: str
    fingerprint: str
    created_at: datetime
    expires_at: datetime
    abandoned_before: datetime
    render: Callable[[list[Notification]], tuple[int, bytes]]
    status: int = 0
    body: bytes = b""


# --- resolving drafts -----------------------------------------------------------------------------


def build_specs(tenant: Tenant, drafts: Sequence[Draft], *, cached: bool = True) -> list[NotificationSpec]:
    """Resolve provider/template names and render templates; raise SpecErrors.

    `cached`: from this process's copy of the tenant's configuration (notifications.tenant_config;
    no query once warm) and the specs carry its version, which `create_notifications` checks in its
    statement. A name the copy does not know is looked up afresh before it is refused. Uncached,
    three queries (providers, templates, categories) and no version check (callers that hold their own
    transaction). A draft to a subscriber costs one query more (its addresses and time zone), whatever
    the batch's size. A non-critical draft created inside its quiet hours gets the window's end as its
    `scheduled_for` (routing.quiet_hours), from the same cached categories: no query of its own.
    """
    subscribers = _subscribers(tenant, drafts)
    if any(d.channel == "in_app" and not d.provider for d in drafts):
        _ensure_inbox(tenant, cached)
    if not cached:
        return _build_specs(tenant, drafts, _fresh_config(tenant, drafts), None, subscribers)
    config = tenant_config.get(tenant.pk)
    if config is not None:
        try:
            return _build_specs(tenant, drafts, config, config.version, subscribers)
        except SpecErrors:
            pass  # perhaps a name added since the copy was read: ask the database before refusing
    config = tenant_config.load(tenant.pk)
    return _build_specs(tenant, drafts, config, config.version, subscribers)


def _ensure_inbox(tenant: Tenant, cached: bool) -> None:
    """Every tenant has the built-in `inbox` provider: made on its first in_app notification (the
    save bumps the tenant's config version, so cached copies learn of it)."""
    if cached:
        config = tenant_config.get(tenant.pk)
        if config is not None and "in_app" in config.defaults:
            return
    if not Provider.objects.for_tenant(tenant).filter(channel="in_app", is_default=True).exists():
        ensure_inbox_provider(tenant.pk)


@dataclass(slots=True)
class _Resolved:
    """What a draft's subscriber gives it: its address for the draft's channel and its preferences."""

    found: bool
    address: str | None = None
    preferences: dict[str, Any] = field(default_factory=dict)
    timezone: str = ""  # IANA name; "" is UTC (quiet hours)
    fallback_address: str | None = None  # its address for the draft's fallback channel, if it has one
    devices: list[tuple[uuid.UUID, str]] = field(default_factory=list)  # its active push devices (id, kind)
    locale: str = ""  # BCP 47 tag; "" none (which template variant it reads)

    def opted_out(self, category: str, channel: str) -> bool:
        return self.preferences.get(category, {}).get(channel) is False


# With a push among the drafts, each subscriber's active push devices too ("<id>:<kind>", oldest first):
# a probe of device_subscriber_recent_idx each, in the same statement.
_SUBSCRIBERS_WITH_DEVICES_SQL = """SELECT external_id, email, phone, push_tokens, preferences, timezone, locale,
       ARRAY(SELECT d.id::text || ':' || d.kind FROM devices d WHERE d.subscriber_id = subscribers.id AND d.active
             ORDER BY d.created_at, d.id)
FROM subscribers WHERE tenant_id = %s AND external_id = ANY(%s)"""
_SUBSCRIBERS_SQL = """SELECT external_id, email, phone, push_tokens, preferences, timezone, locale FROM subscribers
WHERE tenant_id = %s AND external_id = ANY(%s)"""


def _subscribers(tenant: Tenant, drafts: Sequence[Draft]) -> list[_Resolved | None]:
    """Per draft, what its subscriber gives it (None: the draft names none). One query for the
    batch (none when no draft names a subscriber), and the addresses the drafts' channels need are
    decrypted together (crypto.decrypt_many), not row by row through model instances."""
    ids = sorted({d.subscriber for d in drafts if d.subscriber is not None})
    if not ids:
        return [None] * len(drafts)
    pushes = any(d.subscriber is not None and d.channel == "push" for d in drafts)
    with connections[Subscriber.objects.db].cursor() as cursor:
        cursor.execute(_SUBSCRIBERS_WITH_DEVICES_SQL if pushes else _SUBSCRIBERS_SQL, [tenant.pk, ids])
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    resolved: list[_Resolved | None] = []
    tokens: list[str] = []
    waiting: list[tuple[_Resolved, str]] = []
    for draft in drafts:
        if draft.subscriber is None:
            resolved.append(None)
            continue
        row = rows.get(draft.subscriber)
        if row is None:
            resolved.append(_Resolved(found=False))
            continue
        email, phone, push_tokens, preferences, zone, locale, *found = row
        if isinstance(preferences, str):
            preferences = json.loads(preferences)
        item = _Resolved(found=True, preferences=preferences or {}, timezone=zone or "", locale=locale or "")
        if found and found[0] and draft.channel == "push":  # its active push devices, oldest first
            item.devices = [(uuid.UUID(text[:36]), text[37:]) for text in found[0]]
        resolved.append(item)
        addresses = {"email": email, "sms": phone, "push": push_tokens}
        wanted = [(draft.channel, "address")]
        if draft.fallback is not None:
            wanted.append((draft.fallback.channel, "fallback_address"))
        for channel, attribute in wanted:
            token = addresses.get(channel)
            if token:
                tokens.append(token)
                waiting.append((item, channel, attribute))
    for (item, channel, attribute), token, opened in zip(waiting, tokens, crypto.decrypt_many(tokens), strict=True):
        text = opened if opened is not None else crypto.decrypt(token, where="Subscriber address")
        if channel == "push":
            first = json.loads(text)
            setattr(item, attribute, first[0] if first else None)
        else:
            setattr(item, attribute, text or None)
    return resolved


def _native_providers(draft: Draft, provider: Provider, config: tenant_config.TenantConfig) -> dict[str, Provider]:
    """Device kind → the provider that serves it, for a push draft whose provider is of a native push
    kind (empty: a webhook-kind push, to an address). A named provider serves its own kind only;
    otherwise each kind is served by the first provider of that kind in the push failover order (or
    the default)."""
    if provider.kind not in push.DEVICE_KINDS:
        return {}
    if draft.provider:
        return {provider.kind: provider}
    candidates = [p for p in config.providers.values()
                  if p.channel == "push" and p.kind in push.DEVICE_KINDS
                  and (p.failover_order is not None or p.is_default)]  # fmt: skip
    candidates.sort(key=lambda p: (p.failover_order is None, p.failover_order or 0, p.name))
    chosen = {provider.kind: provider}
    for p in candidates:
        chosen.setdefault(p.kind, p)
    return chosen


def _fresh_config(tenant: Tenant, drafts: Sequence[Draft]) -> tenant_config.TenantConfig:
    names = {d.provider for d in drafts if d.provider}
    default_channels = {d.channel for d in drafts if not d.provider}
    providers = Provider.objects.for_tenant(tenant).filter(
        Q(name__in=names) | Q(channel__in=default_channels) & (Q(is_default=True) | Q(failover_order__isnull=False))
    )
    config = tenant_config.TenantConfig(version=0, providers={}, defaults={})
    for provider in providers:
        config.providers[provider.name] = provider
    config.defaults.update(tenant_config.first_choices(config.providers.values()))
    keys = {d.template for d in drafts if d.template}
    found = {t.key: t for t in Template.objects.for_tenant(tenant).filter(key__in=keys)} if keys else {}
    config.templates.update({key: found.get(key) for key in keys})
    # general's too, whatever the drafts name: its quiet hours are the tenant default
    categories = {d.category for d in drafts} | {GENERAL}
    config.categories = {c.key: c for c in Category.objects.for_tenant(tenant).filter(key__in=categories)}
    return config


def _build_specs(
    tenant: Tenant, drafts: Sequence[Draft], config: tenant_config.TenantConfig, version: int | None,
    subscribers: list[_Resolved | None],
) -> list[NotificationSpec]:  # fmt: skip
    by_name, defaults = config.providers, config.defaults
    keys = {d.template for d in drafts if d.template}
    templates = tenant_config.templates(config, tenant.pk, keys) if keys else {}

    refused_queues = _queues_past_the_cap(tenant, {d.queue for d in drafts})
    holds = quiet_hours.Holds(timezone.now())
    general = config.categories.get(GENERAL)
    general_quiet = general.quiet_hours if general is not None else None

    specs: list[NotificationSpec] = []
    errors: dict[int, dict[str, list[str]]] = {}
    for index, draft in enumerate(drafts):
        problems: dict[str, list[str]] = {}
        if draft.queue in refused_queues:
            problems["queue"] = [refused_queues[draft.queue]]
        provider = _provider_for(draft, by_name, defaults, problems)
        category = config.categories.get(draft.category)
        if category is None and draft.category != GENERAL:
            problems["category"] = [f"no category with key {draft.category!r}: create it first (POST categories)"]
        critical = category is not None and category.critical
        recipient, opted_out, zone = draft.recipient, False, ""
        subscriber = subscribers[index]
        native = _native_providers(draft, provider, config) if draft.channel == "push" and provider else {}
        targets: list[tuple[uuid.UUID, str, Provider]] | None = None
        if native and subscriber is None:
            try:
                devices.recipient_identity(provider.kind, recipient)
            except (ValueError, FieldErrors) as exc:
                problems["recipient"] = [f"not a {provider.kind} device: {_first_message(exc)}"]
        if subscriber is not None:
            address = subscriber.address
            if not subscriber.found:
                problems["subscriber"] = [f"no subscriber with external_id {draft.subscriber!r}"]
            elif native:
                targets = [(device_id, kind, native[kind]) for device_id, kind in subscriber.devices if kind in native]
                if not targets:
                    problems["subscriber"] = [
                        f"subscriber {draft.subscriber!r} has no active push device of a kind its push provider(s) "
                        f"serve ({', '.join(sorted(native))}): register one (POST subscribers/{{external_id}}/devices)"
                    ]
                else:
                    recipient, zone = f"subscriber:{draft.subscriber}", subscriber.timezone
                    opted_out = not critical and subscriber.opted_out(draft.category, draft.channel)
            elif draft.channel == "in_app":  # the subscriber's feed is its address (inbox.statements)
                recipient, zone = f"subscriber:{draft.subscriber}", subscriber.timezone
                opted_out = not critical and subscriber.opted_out(draft.category, draft.channel)
            elif address is None:
                problems["subscriber"] = [
                    f"subscriber {draft.subscriber!r} has no address for channel {draft.channel!r}: add one "
                    "(PUT subscribers/{external_id}) or give `recipient`"
                ]
            else:
                recipient, zone = address, subscriber.timezone
                opted_out = not critical and subscriber.opted_out(draft.category, draft.channel)
        template = rendered = None
        subject, body = draft.subject, draft.body
        if draft.template:
            template = templates.get(draft.template)
            if template is None:
                problems["template"] = [f"no template with key {draft.template!r}"]
            elif template.channel != draft.channel:
                problems["template"] = [f"template {template.key!r} is for channel {template.channel!r}"]
            else:
                rendered = _render(template, draft, subscriber, problems)
                subject, body = rendered.subject, rendered.body
        # the push fields, and the vendors' payload limits once rendered (in_app keeps its own fields)
        if (draft.push and draft.channel == "push") or native:
            for name, messages in push.check(draft.push or {}, subject, body, tuple(native)).items():
                problems.setdefault(name, []).extend(messages)
        step = _fallback_for(draft, subscriber, defaults, critical, problems)
        if problems:
            errors[index] = problems
            continue
        scheduled_for = draft.scheduled_for
        if not critical and not opted_out:  # held until the end of the recipient's quiet hours, if in them
            quiet = quiet_hours.window(category.quiet_hours if category is not None else None, general_quiet)
            scheduled_for = holds.hold_until(quiet, zone, scheduled_for)
        spec = NotificationSpec(
            channel=draft.channel, recipient=recipient, provider=provider, subject=subject, body=body,
            template=template, context=draft.context, priority=draft.priority, queue=draft.queue,
            scheduled_for=scheduled_for, metadata=draft.metadata, config_version=version,
            category=draft.category, subscriber=draft.subscriber, critical=critical, opted_out=opted_out,
            provider_named=bool(draft.provider), push=draft.push, devices=targets,
        )  # fmt: skip
        if rendered is not None:
            spec.html_body, spec.template_version, spec.locale = rendered.html_body, rendered.version, rendered.locale
        if targets:  # the item goes through the provider of its first device's kind (its breaker, its lane)
            spec.provider = targets[0][2]
        if step is not None:
            # The same subject, body, template and context, on the next channel (nothing to render again).
            next_channel, address, next_provider, next_opted_out = step
            spec.fallback_steps = draft.fallback.as_json()
            spec.fallback = NotificationSpec(
                channel=next_channel, recipient=address, provider=next_provider, subject=subject, body=body,
                template=template, context=draft.context, priority=draft.priority, queue=draft.queue,
                metadata=draft.metadata, config_version=version, category=draft.category,
                subscriber=draft.subscriber, critical=critical, opted_out=next_opted_out, provider_named=False,
            )  # fmt: skip
            if rendered is not None:  # the HTML part only where the next channel is email too (never: one channel)
                spec.fallback.template_version, spec.fallback.locale = rendered.version, rendered.locale
        specs.append(spec)
    if errors:
        raise SpecErrors(errors)
    return specs


def _fallback_for(
    draft: Draft, subscriber: _Resolved | None, defaults: dict[str, Provider], critical: bool,
    problems: dict[str, list[str]],
) -> tuple[str, str, Provider, bool] | None:  # fmt: skip
    """(channel, address, provider, opted out) of the draft's fallback step, or None (none asked for,
    or a problem noted under `fallback`). Its provider is the next channel's first in failover order."""
    if draft.fallback is None or subscriber is None or not subscriber.found:
        return None
    channel = draft.fallback.channel
    if subscriber.fallback_address is None:
        problems.setdefault("fallback", []).append(
            f"subscriber {draft.subscriber!r} has no address for the fallback channel {channel!r}: add one "
            "(PUT subscribers/{external_id}) or choose another channel"
        )
        return None
    provider = defaults.get(channel)
    if provider is None:
        problems.setdefault("fallback", []).append(
            f"no default provider for the fallback channel {channel!r}: mark a provider is_default or give it a "
            "failover_order"
        )
        return None
    opted_out = not critical and subscriber.opted_out(draft.category, channel)
    return channel, subscriber.fallback_address, provider, opted_out


def _provider_for(
    draft: Draft, by_name: dict[str, Provider], defaults: dict[str, Provider], problems: dict[str, list[str]]
) -> Provider | None:
    if draft.provider:
        provider = by_name.get(draft.provider)
        if provider is None:
            problems["provider"] = [f"no provider named {draft.provider!r}"]
        elif provider.channel != draft.channel:
            problems["provider"] = [f"provider {provider.name!r} serves channel {provider.channel!r}"]
        return provider
    provider = defaults.get(draft.channel)
    if provider is None:
        problems["provider"] = [
            f"no default provider for channel {draft.channel!r}: name one, or mark a provider is_default"
        ]
    return provider


def _render(
    template: Template, draft: Draft, subscriber: _Resolved | None, problems: dict[str, list[str]]
) -> rendering.Rendered:
    """The template's variant for the draft's locale, else its subscriber's (templating.rendering),
    rendered on the draft's context; each part's failure noted under `template` (`subject` for a
    rendered subject past the line limit)."""
    locales = (draft.locale, subscriber.locale if subscriber is not None else None)
    rendered, errors = rendering.render(template, draft.context, locales=locales, html=draft.channel == "email")
    for part, message in errors.items():
        if part == "subject" and message.startswith("the rendered subject"):
            problems.setdefault("subject", []).append(f"template {template.key!r}: {message}")
        else:
            problems.setdefault("template", []).append(f"{part} of {template.key!r}: {message}")
    return rendered


# --- queues of a tenant ----------------------------------------------------------------------------

_KNOWN_QUEUES: OrderedDict[Any, frozenset[str]] = OrderedDict()  # tenant id → names stored (this process)
_KNOWN_LOCK = threading.Lock()
_KNOWN_TENANTS = 10_000


def _known_queues(tenant_id: Any) -> frozenset[str]:
    with _KNOWN_LOCK:
        names = _KNOWN_QUEUES.get(tenant_id, frozenset())
        if names:
            _KNOWN_QUEUES.move_to_end(tenant_id)
        return names


def _remember_queues(tenant_id: Any, names: set[str]) -> None:
    with _KNOWN_LOCK:
        _KNOWN_QUEUES[tenant_id] = _KNOWN_QUEUES.get(tenant_id, frozenset()) | names
        _KNOWN_QUEUES.move_to_end(tenant_id)
        while len(_KNOWN_QUEUES) > _KNOWN_TENANTS:
            _KNOWN_QUEUES.popitem(last=False)


def _queues_past_the_cap(tenant: Tenant, names: set[str]) -> dict[str, str]:
    """Names this request may not add, each with its error. No query when every name is `default`
    or already known to this process (the usual case); else one SELECT of the tenant's names."""
    wanted = names - {DEFAULT_QUEUE} - _known_queues(tenant.pk)
    if not wanted:
        return {}
    stored = set(TenantQueue.objects.for_tenant(tenant).values_list("name", flat=True))
    _remember_queues(tenant.pk, stored)
    cap = int(settings.OMNIPOST_MAX_QUEUES_PER_TENANT)
    room = max(0, cap - len(stored))
    new = sorted(wanted - stored)
    return {
        name: f"the tenant already uses {len(stored)} queues, the most allowed is {cap} "
        f"(OMNIPOST_MAX_QUEUES_PER_TENANT); use one of its existing queues"
        for name in new[room:]
    }


# --- creating -------------------------------------------------------------------------------------


def _masked(channel: str, recipient: str) -> str:
    masked = mask_recipient(channel, recipient)
    return masked if len(masked) <= MASKED_MAX else masked[: MASKED_MAX - 1] + "…"


def create_notifications(
    tenant: Tenant,
    specs: Sequence[NotificationSpec],
    *,
    actor: str,
    idempotency: IdempotentResponse | None = None,
    traced: bool = True,
) -> list[Notification]:
    """Store notifications and queue or schedule them, in the caller's transaction if any.

    One statement of writable CTEs whatever len(specs): the notifications, their queue
    items and scheduled jobs, new queue names of the tenant, and the `idempotency` record with the
    response it replays; then, after commit, the doorbells (one NOTIFY each for dispatchers and
    schedulers, see queue.ring_after_commit). Queue payloads carry routing data only, never a recipient.
    Raises StaleConfig when the specs' config_version is no longer the tenant's, and
    IdempotencyKeyTaken when the key has a record already; nothing is stored then.
    The returned instances have `provider`, `template` and `tenant` loaded (no further queries).
    Where traces are exported, each new notification's trace starts here (`traced`; False: the caller's
    thread starts them, as create_notifications_shared does for a request's own rows).
    """
    if not specs:
        return []
    started = tracing.now() if tracing.ENABLED else 0
    now = timezone.now()
    created = [_instance(tenant, spec, now) for spec in specs]
    # Each fallback is stored with its notification, in the same statement (notifications.fallback).
    fallbacks = _fallback_rows(tenant, specs, created, now)
    rows = created + [linked for _, linked in fallbacks]
    specs = [*specs, *(spec.fallback for spec in specs if spec.fallback is not None)]
    # The suppression check of every row not already opted out (a keyed HMAC each, no query).
    checked = [i for i, spec in enumerate(specs) if not spec.opted_out]
    lookups = [
        suppressions.lookup_for(specs[i].channel, specs[i].recipient, specs[i].category, critical=specs[i].critical)
        for i in checked
    ]
    versions = [spec.config_version for spec in specs if spec.config_version is not None]
    version = min(versions) if versions else None
    new_queues = {spec.queue for spec in specs} - {DEFAULT_QUEUE} - _known_queues(tenant.pk)
    # Rows are stored with the statuses decided here, and the statement verifies that the
    # suppression check (folded into it) blocks exactly the rows marked `suppressed`: usually none,
    # so one statement; when it finds others, it stores nothing and names them, and the rows (and the
    # idempotent response rendered from them) are decided again.
    expected: list[int] = []
    with transaction.atomic() if any(spec.devices for spec in specs) else contextlib.nullcontext():
        jobs = _store_checked(tenant, specs, rows, created, fallbacks, checked, lookups, expected, now, version,
                              idempotency, new_queues)  # fmt: skip
        _store_devices(tenant, specs, rows)
    logger.info("%s created %d notification(s) (%d scheduled, %d fallbacks)", actor, len(created), len(jobs),
                len(fallbacks))  # fmt: skip
    if started:  # the fallbacks' traces start here whoever traces the rest
        _trace_created(rows if traced else [linked for _, linked in fallbacks], started)
    return created


def _store_devices(tenant: Tenant, specs: Sequence[NotificationSpec], rows: list[Notification]) -> None:
    """The devices each push to a subscriber goes to, `pending` (one statement, none without any)."""
    values = [(row.pk, device_id, kind, provider.pk) for spec, row in zip(specs, rows, strict=True)
              if spec.devices and row.status != Status.SUPPRESSED
              for device_id, kind, provider in spec.devices]  # fmt: skip
    if values:
        with connections[Notification.objects.db].cursor() as cursor:
            cursor.execute(
                statements.INSERT_DEVICES, [tenant.pk, *(list(column) for column in zip(*values, strict=True))]
            )


def _store_checked(
    tenant: Tenant, specs: Sequence[NotificationSpec], rows: list[Notification], created: list[Notification],
    fallbacks: list[tuple[Notification, Notification]], checked: list[int], lookups: list[Any], expected: list[int],
    now: datetime, version: int | None, idempotency: IdempotentResponse | None, new_queues: set[str],
) -> list[ScheduledJob]:  # fmt: skip
    for _ in range(_CHECK_ROUNDS):
        _mark_suppressed(rows, [checked[i] for i in expected])
        _follow_originals(fallbacks)
        jobs = _jobs_for(tenant, rows, now)
        if idempotency is not None:
            idempotency.status, idempotency.body = idempotency.render(created)
        found = _store(tenant, rows, jobs, now, version=version, idempotency=idempotency,
                       new_queues=new_queues, check=(lookups, expected))  # fmt: skip
        if found is None:
            return jobs
        expected = found
    raise StaleConfig()  # suppressions changing under every attempt: the caller resolves again


def _trace_created(rows: list[Notification], started: int) -> None:
    """The root span of each new notification's trace (core.tracing), once the rows are committed."""
    ended = tracing.now()
    if not rows:
        return
    # A fallback's trace is linked to its notification's: it is sent if and when that one fails.
    roots = [(row.pk, {"omnipost.channel": row.channel, "omnipost.status": row.status,
                       "omnipost.provider_kind": row.provider.kind if row.provider is not None else ""},
              row.__dict__.get("fallback_of"))
             for row in rows]  # fmt: skip

    def emit() -> None:
        try:
            tracing.roots("notification.create", roots, started, ended)
        except Exception:  # noqa: BLE001 - never in the way of a create: the rows are stored
            logger.exception("could not trace %d created notification(s)", len(roots))

    transaction.on_commit(emit, using=Notification.objects.db)


_CHECK_ROUNDS = 4

# Single creates of concurrent request threads share one statement per tenant (core.grouping): a
# create is one small row whose statement, commit and WAL flush cost the same for a few rows.
SHARED_MAX_ROWS = 64


def _create_shared_batch(context: tuple[Tenant, str], specs: list[NotificationSpec]) -> list[Notification]:
    tenant, actor = context
    return create_notifications(tenant, specs, actor=actor, traced=False)  # each request's thread traces its own


_SHARED = GroupRunner(_create_shared_batch, key=lambda context: (context[0].pk, context[1]),
                      max_items=SHARED_MAX_ROWS)  # fmt: skip


def create_notifications_shared(
    tenant: Tenant, specs: Sequence[NotificationSpec], *, actor: str, idempotency: IdempotentResponse | None = None
) -> list[Notification]:
    """`create_notifications` for a request thread: in autocommit, without an Idempotency-Key, its
    statement is shared with this process's concurrent requests for the same tenant and actor, and
    it gets its own rows (every request of a batch raises what the batch raised: StaleConfig, a lost
    session; nothing of the batch is stored then). Otherwise alone."""
    connection = connections[Notification.objects.db]
    if idempotency is not None or connection.in_atomic_block:
        return create_notifications(tenant, specs, actor=actor, idempotency=idempotency)
    started = tracing.now() if tracing.ENABLED else 0
    rows, start = _SHARED.submit((tenant, actor), list(specs))
    mine = rows[start : start + len(specs)]
    if started:  # the request's own rows, linked to its span (core.tracing), whichever thread stored them
        _trace_created(mine, started)
    return mine


def _fallback_rows(
    tenant: Tenant, specs: Sequence[NotificationSpec], created: list[Notification], now: datetime
) -> list[tuple[Notification, Notification]]:
    """(notification, its fallback) for each spec with a fallback step, the two linked by id. The
    fallback is `scheduled` with no job (and no due time) until the dispatcher or a receipt gives it
    one (notifications.fallback); suppressed if the subscriber opted out of the category on its channel."""
    pairs = []
    for spec, row in zip(specs, created, strict=True):
        if spec.fallback is None:
            continue
        linked = _instance(tenant, spec.fallback, now)
        if linked.status != Status.SUPPRESSED:
            linked.status, linked.enqueued_at = Status.SCHEDULED, None
        linked.__dict__["fallback_of"] = row.id
        row.__dict__.update(fallback=spec.fallback_steps, fallback_notification_id=linked.id)
        pairs.append((row, linked))
    return pairs


def _follow_originals(pairs: Sequence[tuple[Notification, Notification]]) -> None:
    """A notification suppressed at creation takes its fallback with it (`cancelled`): the fallback
    follows what happens to a sent notification, and this one is never sent. Run after each
    suppression round, which may change the originals' statuses in either direction."""
    for original, linked in pairs:
        if linked.status in (Status.SCHEDULED, Status.CANCELLED):
            linked.status = Status.CANCELLED if original.status == Status.SUPPRESSED else Status.SCHEDULED


def _mark_suppressed(rows: list[Notification], positions: Sequence[int]) -> None:
    """The rows a suppression blocks at creation are `suppressed` (never queued or scheduled); the
    others get back the status `_instance` gave them (a suppression may have gone since the last round)."""
    blocked = set(positions)
    for i, row in enumerate(rows):
        if i in blocked:
            if row.status != Status.SUPPRESSED:
                row.__dict__["_created_as"] = (row.status, row.enqueued_at)
                row.status, row.enqueued_at = Status.SUPPRESSED, None
        elif "_created_as" in row.__dict__:
            row.status, row.enqueued_at = row.__dict__.pop("_created_as")


def _jobs_for(tenant: Tenant, rows: list[Notification], now: datetime) -> list[ScheduledJob]:
    jobs = []
    for n in rows:
        job = None
        if n.status == Status.SCHEDULED and n.fallback_of is None:  # a fallback's job comes later
            job = ScheduledJob(tenant=tenant, notification_id=n.pk, run_at=n.scheduled_for, created_at=now)
            jobs.append(job)
        n.scheduled_job_id = job.pk if job is not None else None  # what the response shows
    return jobs


_GATE = """gate AS (SELECT {version} AS version_ok, {lock} AS key_free, {check} AS check_ok)"""
_ITEMS = "items AS (" + insert_items_sql(  # noqa: S608 - fixed fragments, values are parameters
    """(SELECT n.queue AS queue_name, n.priority, jsonb_build_object('channel', n.channel) AS payload,
               0::float8 AS delay, n.tenant_id, n.id AS notification_id, n.provider_id
        FROM n WHERE n.status = 'queued') s""",
    order_by="s.notification_id",  # item ids in creation order (uuid7 ids sort so): the claim's tie-break
) + " RETURNING 1)"  # noqa: S608 - fixed fragments, values are parameters
_JOBS = "jobs AS (" + insert_jobs_sql(  # noqa: S608
    """(SELECT u.job_id, n.tenant_id, n.id AS notification_id, n.scheduled_for AS run_at, %s::timestamptz AS created_at
        FROM n JOIN unnest({array}::uuid[], {array}::uuid[]) AS u(notification_id, job_id)
               ON u.notification_id = n.id) s"""
) + " RETURNING 1)"


def _store(
    tenant: Tenant, rows: list[Notification], jobs: list[ScheduledJob], now: datetime, *,
    version: int | None, idempotency: IdempotentResponse | None, new_queues: set[str],
    check: tuple[list[suppressions.Lookup], list[int]] | None = None,
) -> list[int] | None:  # fmt: skip
    """Store in one statement. `check`: (lookups, positions expected blocked): the statement runs
    the suppression check and stores only if exactly the expected positions (sorted) are blocked;
    otherwise it stores nothing and this returns the positions it found. None: stored."""
    connection = connections[Notification.objects.db]
    params: list[Any] = []
    keys = None
    if check is not None and check[0]:
        lookups = check[0]
        keys = len(lookups[0].indexes)
        params += [list(range(len(lookups))), [x.channel for x in lookups], [x.scope for x in lookups]]
        params += [[x.indexes[k] for x in lookups] for k in range(keys)]
        params.append(tenant.pk)
    if version is not None:
        params += [tenant.pk, version]
    if idempotency is not None:
        params.append(_lock_name(tenant, idempotency.key))
    if keys is not None:
        params.append(sorted(check[1]))
    if idempotency is not None:
        body = IdempotencyRecord._meta.get_field("response_body").get_prep_value(idempotency.body.decode())
        params += [tenant.pk, idempotency.key, idempotency.fingerprint, idempotency.status, body,
                   idempotency.created_at, idempotency.expires_at, idempotency.abandoned_before]  # fmt: skip
    if new_queues:
        params += [tenant.pk, sorted(new_queues), now]
    gated = "EXISTS (SELECT 1 FROM record)" if idempotency is not None else _GATED
    insert_sql, insert_params = statements.insert_notifications_sql(connection, rows, where=gated)
    params += insert_params
    queued = [n for n in rows if n.status == Status.QUEUED]
    if jobs:
        params += [now, [job.notification_id for job in jobs], [job.job_id for job in jobs]]
    sql = _create_statement(keys, version is not None, idempotency is not None, bool(new_queues), insert_sql,
                            bool(queued), bool(jobs), len(rows) > 1, mode_of(tenant))  # fmt: skip
    version_ok, key_free, check_ok, stored, positions = hot_sql.fetchone(sql, params, using=connection.alias)
    if not version_ok:
        tenant_config.forget(tenant.pk)
        raise StaleConfig()
    if not check_ok:
        return list(positions)
    if not key_free or stored != len(rows):
        raise IdempotencyKeyTaken(in_progress=not key_free)
    for row in rows:
        row._state.adding, row._state.db = False, connection.alias
    if new_queues:
        transaction.on_commit(lambda: _remember_queues(tenant.pk, new_queues))
    if queued:
        ring_after_commit(NOTIFY_CHANNEL, ",".join(sorted({n.queue for n in queued})), connection=connection)
    ring_schedulers(jobs, using=connection.alias)
    return None


_GATED = "(SELECT version_ok AND key_free AND check_ok FROM gate)"


@lru_cache(maxsize=64)
def _create_statement(
    keys: int | None, versioned: bool, idempotent: bool, queues: bool, insert_sql: str, queued: bool, jobs: bool,
    many: bool, test: bool = False,
) -> str:  # fmt: skip
    """`_store`'s text for its shape, composed once (its parameters follow the same order): the
    suppression check of `keys` blind indexes (None: none), the tenant's config version, the
    Idempotency-Key's lock and record, new queue names, the notifications' INSERT, their queue items,
    their scheduled jobs. `many` (a batch): the arrays travel in binary, as those of
    `statements.insert_notifications_sql` do; one create's stay text, so its long statement keeps
    `core.hot_sql`'s converted-once placeholders."""
    ctes: list[str] = []
    array = "%b" if many else "%s"
    check_sql, positions_sql = "true", "NULL::int[]"
    if keys is not None:
        arrays = ", ".join(f"{array}::{kind}[]" for kind in ["int", "varchar", "varchar", *["varchar"] * keys])
        names = ", ".join(["i", "channel", "scope", *[f"b{k}" for k in range(keys)]])
        found = suppressions.check_sql("%s::uuid", "u.channel", [f"u.b{k}" for k in range(keys)], "u.scope",
                                       test_sql="true" if test else "false")  # fmt: skip
        ctes.append(f"blocked AS (SELECT coalesce(array_agg(u.i ORDER BY u.i), '{{}}') AS positions "  # noqa: S608
                    f"FROM unnest({arrays}) AS u({names}) WHERE {found})")  # fmt: skip
        check_sql = "(SELECT positions FROM blocked) = %s::int[]"
        positions_sql = "(SELECT positions FROM blocked)"
    version_sql = "(SELECT config_version FROM tenants WHERE id = %s) = %s" if versioned else "true"
    lock_sql = "pg_try_advisory_xact_lock(hashtextextended(%s, 0))" if idempotent else "true"
    ctes.append(_GATE.format(version=version_sql, lock=lock_sql, check=check_sql))
    if idempotent:
        ctes.append(statements.IDEMPOTENCY_RECORD)
    if queues:
        ctes.append(statements.NEW_QUEUES)
    ctes.append(f"n AS ({insert_sql} RETURNING id, tenant_id, provider_id, queue, priority, channel, status, "
                "scheduled_for)")  # fmt: skip
    if queued:
        ctes.append(_ITEMS)
    if jobs:
        ctes.append(_JOBS.replace("{array}", array))
    return (f"WITH {', '.join(ctes)} SELECT version_ok, key_free, check_ok, (SELECT count(*) FROM n), "  # noqa: S608
            f"{positions_sql} FROM gate")  # fmt: skip


def store_idempotency_record(tenant: Tenant, idempotency: IdempotentResponse) -> None:
    """Write the record alone, in the caller's transaction (for workflows that are not one statement,
    e.g. enrollments); raises IdempotencyKeyTaken when the key has a live record."""
    connection = connections[IdempotencyRecord.objects.db]
    body = IdempotencyRecord._meta.get_field("response_body").get_prep_value(idempotency.body.decode())
    gate = _GATE.format(version="true", lock="true", check="true")
    sql = "WITH " + gate + ", " + statements.IDEMPOTENCY_RECORD + " SELECT count(*) FROM record"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [tenant.pk, idempotency.key, idempotency.fingerprint, idempotency.status, body,
                             idempotency.created_at, idempotency.expires_at, idempotency.abandoned_before])  # fmt: skip
        if not cursor.fetchone()[0]:
            raise IdempotencyKeyTaken(in_progress=False)


def try_idempotency_lock(tenant: Tenant, key: str) -> bool:
    """The advisory lock the create statement takes for `key`, until the caller's transaction ends;
    False while another request holds it."""
    with connections[IdempotencyRecord.objects.db].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [_lock_name(tenant, key)])
        return bool(cursor.fetchone()[0])


def _lock_name(tenant: Tenant, key: str) -> str:
    return f"idempotency:{tenant.pk}:{key}"


def _instance(tenant: Tenant, spec: NotificationSpec, now: datetime) -> Notification:
    """A Notification not stored yet, with `tenant`, `provider` and `template` loaded."""
    future = spec.scheduled_for is not None and spec.scheduled_for > now
    status = Status.SUPPRESSED if spec.opted_out else Status.SCHEDULED if future else Status.QUEUED
    values = {
        "id": uuid7(), "tenant_id": tenant.pk, "channel": spec.channel, "recipient": spec.recipient,
        "recipient_masked": _masked(spec.channel, spec.recipient), "provider_id": spec.provider.pk,
        "template_id": spec.template.pk if spec.template else None, "context": spec.context,
        "template_version": spec.template_version, "locale": spec.locale, "html_body": spec.html_body,
        "subject": spec.subject, "body": spec.body, "priority": spec.priority, "queue": spec.queue,
        "status": status, "scheduled_for": spec.scheduled_for, "metadata": spec.metadata, "category": spec.category,
        "subscriber": spec.subscriber,
        "attempt_count": 0, "attempt_offset": 0, "last_error_code": "",
        "provider_named": spec.provider_named,
        "created_at": now, "updated_at": now,
        "enqueued_at": None if future or spec.opted_out else now, "delivered_at": None,
        "receipt": None, "bounce_type": None,
        "fallback": None, "fallback_notification_id": None, "fallback_of": None, "push": spec.push,
        "bulk_send_id": spec.bulk_send_id, "bulk_row": spec.bulk_row,
        "test": mode_of(tenant),
    }  # fmt: skip
    # Straight into the instance's __dict__, as Model.__init__ would leave it: its per-field setattr
    # runs the foreign keys' descriptors (a quarter of a 1,000-item batch's Python time).
    row = Notification.__new__(Notification)
    row.__dict__.update(values)
    row._state = ModelState()  # adding, not stored yet
    row._state.fields_cache.update(tenant=tenant, provider=spec.provider, template=spec.template)
    return row


# --- cancelling -----------------------------------------------------------------------------------


def cancel_notification(tenant: Tenant, notification_id: uuid.UUID | str, *, actor: str) -> Notification:
    """scheduled/queued/retrying → cancelled; its pending job is cancelled and its queue item
    deleted. 404 for another tenant's id; 409 if it cannot be cancelled, including while a
    dispatcher holds its lease (it is being sent: `dispatching`)."""
    notifications = Notification.objects.for_tenant(tenant)
    with transaction.atomic():
        jobs = ScheduledJob.objects.for_tenant(tenant).filter(
            notification_id=notification_id, status=ScheduledJob.Status.PENDING
        )
        jobs_cancelled = jobs.update(status=ScheduledJob.Status.CANCELLED)
        # Lock the queue item first (the order the dispatcher's record statement uses): a claim in
        # flight is waited for and then seen as a lease; an idle item can no longer be claimed.
        if queue.lock_for([notification_id], tenant_id=tenant.pk).get(str(notification_id)):
            raise Conflict("A notification that is dispatching cannot be cancelled.", code="not_cancellable")
        changed = notifications.filter(pk=notification_id, status__in=CANCELLABLE).update(
            status=Status.CANCELLED, updated_at=Now()
        )
        if not changed:
            current = notifications.filter(pk=notification_id).values_list("status", flat=True).first()
            if current is None:
                raise NotFound("No notification with this id.")
            raise Conflict(f"A notification that is {current} cannot be cancelled.", code="not_cancellable")
        queue.remove_for([notification_id], tenant_id=tenant.pk)
        fallback.cancel_with(tenant.pk, [notification_id])
        notification = notifications.select_related("provider", "template").get(pk=notification_id)
        AuditEvent.record(
            actor=actor, action="notification.cancelled", target=notification,
            details={"scheduled_job_cancelled": bool(jobs_cancelled)},
        )  # fmt: skip
    return notification


def cancel_scheduled(tenant: Tenant, notification_ids: Sequence[uuid.UUID | str], *, actor: str) -> int:
    """The notifications among `notification_ids` still `scheduled` (held for their time or quiet
    hours) end `cancelled`, with their pending jobs and their fallbacks, each audited as
    `cancel_notification` does, in a fixed number of statements whatever their count (the caller's
    transaction). Any other is left to go on: one promoted meanwhile is sent, as any notification past
    `scheduled`. A scheduled notification has no queue item. Returns how many it cancelled."""
    if not notification_ids:
        return 0
    ids = [str(pk) for pk in notification_ids]
    # Jobs first (the scheduler's order: job, then notification): a promotion in flight is waited for,
    # and its notification is no longer `scheduled` after it. Only a scheduled one has a pending job.
    cancel_jobs_for(DEFAULT_JOB_KIND, ids)
    cancelled = statements.cancel_scheduled(tenant.pk, ids)
    if cancelled:
        fallback.cancel_with(tenant.pk, cancelled)
        AuditEvent.objects.bulk_create([
            AuditEvent(actor=actor, action="notification.cancelled", target_type=Notification._meta.label_lower,
                       target_id=str(pk), tenant_id=tenant.pk)
            for pk in cancelled
        ])  # fmt: skip
    return len(cancelled)


def cancel_scheduled_job(tenant: Tenant, job_id: uuid.UUID | str, *, actor: str) -> ScheduledJob:
    """pending → cancelled, and its notification → cancelled. 404 / 409 once executed or cancelled."""
    jobs = ScheduledJob.objects.for_tenant(tenant).filter(kind=DEFAULT_JOB_KIND)  # a workflow's wait is its run's
    with transaction.atomic():
        if not jobs.filter(pk=job_id, status=ScheduledJob.Status.PENDING).update(status=ScheduledJob.Status.CANCELLED):
            current = jobs.filter(pk=job_id).values_list("status", flat=True).first()
            if current is None:
                raise NotFound("No scheduled job with this id.")
            raise Conflict(f"The job is already {current}; only pending jobs can be cancelled.", code="not_cancellable")
        job = jobs.get(pk=job_id)
        if Notification.objects.for_tenant(tenant).filter(pk=job.notification_id, status__in=CANCELLABLE).update(
            status=Status.CANCELLED, updated_at=Now()
        ):
            fallback.cancel_with(tenant.pk, [job.notification_id])
        AuditEvent.record(
            actor=actor, action="scheduled_job.cancelled", target=job,
            details={"notification_id": str(job.notification_id)},
        )  # fmt: skip
    return job


def _first_message(exc: Exception) -> str:
    if isinstance(exc, FieldErrors):
        return "; ".join(f"{k}: {v[0]}" for k, v in exc.errors.items())
    return str(exc)
