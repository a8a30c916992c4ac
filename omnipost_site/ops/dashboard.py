"""The operations dashboard (admin/dashboard/) that the admin index links to: queue depth by
queue and priority, oldest ready age, the last hour's throughput, DLQ size, workers. It reads every
app, so it lives above them all."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path

from core.admin_scoping import visible_tenants
from omnipost_site.ops import figures as ops_figures
from queueing import stats

DASHBOARD_PERMISSION = "queueing.view_queueitem"


def _n(value: int) -> str:
    return f"{value:,}"


def _age(seconds: float) -> str:
    """3.2s, 4m 05s, 2h 10m, 3d 4h."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


def _chart(minutes: list[ops_figures.Minute], value: Any, width: int = 720, height: int = 120) -> dict[str, Any]:
    """Bar geometry for an inline SVG: one bar per minute, scaled to the busiest minute."""
    values = [value(m) for m in minutes]
    peak = max(values, default=0)
    slot = width / max(1, len(values))
    bars = []
    for i, (m, v) in enumerate(zip(minutes, values, strict=True)):
        h = 0.0 if not peak else max(1.5 if v else 0.0, v / peak * (height - 4))
        bars.append({"x": round(i * slot + 1, 1), "y": round(height - h, 1), "w": round(slot - 2, 1),
                     "h": round(h, 1), "label": f"{m.start:%H:%M} UTC: {v:,}"})  # fmt: skip
    return {"bars": bars, "peak": _n(peak), "total": _n(sum(values)), "width": width, "height": height}


def _queue_rows(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows with a heat-map cell per priority (9 … 0), shaded against the fullest cell."""
    peak = max([n for q in figures for n in q["by_priority"].values()], default=0) or 1
    return [
        {
            "queue": q["queue"], "depth": _n(q["depth"]), "ready": _n(q["ready"]), "leased": _n(q["leased"]),
            "delayed": _n(q["delayed"]), "oldest": _age(q["oldest_age_seconds"]),
            "cells": [
                {"text": _n(n) if n else "·", "alpha": round(0.08 + 0.6 * n / peak, 2) if n else 0}
                for n in (q["by_priority"][str(p)] for p in range(9, -1, -1))
            ],
        }  # fmt: skip
        for q in figures
    ]


def _tone(value: float, warn: float, bad: float) -> str:
    return "bad" if value > bad else "warn" if value > warn else "ok"


def dashboard_view(request: HttpRequest) -> HttpResponse:
    """Queue depth by queue and priority, oldest ready age, last hour's throughput, DLQ size, workers."""
    if not request.user.has_perm(DASHBOARD_PERMISSION):
        raise PermissionDenied
    tenants = None if request.user.is_superuser else list(visible_tenants(request).values_list("pk", "name"))
    tenant_ids = None if tenants is None else [pk for pk, _ in tenants]
    figures, exact = stats.queue_figures_sized(tenant_ids)
    about = "" if exact else "≈"
    total = stats.totals(figures)
    minutes = ops_figures.throughput(tenant_ids)
    dlq_open = ops_figures.dlq_open(tenant_ids)
    delivered, failed = _chart(minutes, lambda m: m.delivered), _chart(minutes, lambda m: m.failed)
    transient, permanent = sum(m.transient for m in minutes), sum(m.permanent for m in minutes)
    workers = stats.workers()
    live = sum(1 for w in workers if w.alive)
    cards = [
        {"id": "depth", "label": "Queue depth", "value": about + _n(total["depth"]),
         "hint": f"{len(figures)} queue{'s' if len(figures) != 1 else ''}"},
        {"id": "ready", "label": "Ready", "value": about + _n(total["ready"]), "hint": "claimable now"},
        {"id": "leased", "label": "Leased", "value": about + _n(total["leased"]), "hint": "being delivered"},
        {"id": "delayed", "label": "Delayed", "value": about + _n(total["delayed"]), "hint": "waiting for backoff"},
        {"id": "oldest", "label": "Oldest ready", "value": _age(total["oldest_age_seconds"]),
         "hint": "age of the oldest ready item", "tone": _tone(total["oldest_age_seconds"], 30, 300)},
        {"id": "dlq", "label": "DLQ open", "value": str(dlq_open), "hint": "entries awaiting an operator",
         "tone": "bad" if dlq_open.count else "ok", "link": "admin:dlq_deadletter_changelist"},
        {"id": "delivered", "label": "Delivered · 1 h", "value": delivered["total"],
         "hint": f"peak {delivered['peak']}/min", "tone": "ok"},
        {"id": "failed", "label": "Failed attempts · 1 h", "value": failed["total"],
         "hint": f"{transient:,} transient · {permanent:,} permanent", "tone": "warn" if transient + permanent else ""},
        {"id": "workers", "label": "Workers", "value": f"{live} live",
         "hint": f"{len(workers) - live} stale" if len(workers) > live else "all heartbeating",
         "tone": "bad" if not live else "warn" if len(workers) > live else "ok"},
    ]  # fmt: skip
    if tenant_ids is None:
        estimate = stats.estimated_rows("notifications")
        if estimate is not None:
            cards.append({"id": "notifications", "label": "Notifications", "value": f"≈{estimate:,}",
                          "hint": "table size, planner estimate"})  # fmt: skip
    context = {
        **admin.site.each_context(request),
        "title": "Operations dashboard",
        "scope": "all tenants" if tenants is None else ", ".join(name for _, name in tenants) or "no tenant",
        "cards": cards,
        "queue_rows": _queue_rows(figures),
        "figures_exact": exact,
        "priorities": [str(p) for p in range(9, -1, -1)],
        "charts": [
            ("deliveries", "Deliveries", "#2e8540", delivered),
            ("failures", "Failed attempts", "#ba2121", failed),
        ],
        "workers": [
            {"alive": w.alive, "process": f"{w.worker.host}:{w.worker.pid}", "kind": w.worker.kind,
             "queues": ", ".join(w.worker.queues or []) or "*", "seen": f"{_age(w.seen_seconds_ago)} ago",
             "processed": _n(w.worker.processed), "started": w.worker.started_at}
            for w in workers
        ],  # fmt: skip
    }
    return TemplateResponse(request, "admin/dashboard.html", context)


def _with_dashboard(get_urls: Any) -> Any:
    def urls() -> list:
        return [path("dashboard/", admin.site.admin_view(dashboard_view), name="dashboard"), *get_urls()]

    return urls


def install() -> None:
    """Serve the dashboard at admin/dashboard/ (once, however often the admin is loaded)."""
    if not getattr(admin.site.get_urls, "with_dashboard", False):
        admin.site.get_urls = _with_dashboard(admin.site.get_urls)
        admin.site.get_urls.with_dashboard = True
