"""`manage.py queue_stats`: the `GET queues` figures, throughput, dead letters and workers as a table."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from core.management.tenants import resolve_tenant
from omnipost_site.ops import figures as ops_figures
from queueing import stats

PRIORITIES = [str(p) for p in range(9, -1, -1)]  # highest first, as the claim takes them


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers, two spaces between columns."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]
    lines = []
    for row in [headers, *rows]:
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells).rstrip())
    return lines


class Command(BaseCommand):
    help = (
        "Show queue depth (ready, leased, delayed, oldest ready age, depth by priority), attempts over the "
        "last hour, open dead letters and the registered workers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="only this tenant's items (id or name); workers are always all")
        parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant_ids = [resolve_tenant(options["tenant"]).pk] if options["tenant"] else None
        figures = stats.queue_figures(tenant_ids)
        minutes = ops_figures.throughput(tenant_ids, minutes=60)
        dlq = ops_figures.dlq_open(tenant_ids)
        workers = stats.workers(limit=1000)
        hour = {
            "delivered": sum(m.delivered for m in minutes),
            "transient_error": sum(m.transient for m in minutes),
            "permanent_error": sum(m.permanent for m in minutes),
        }
        if options["json"]:
            self.stdout.write(self._json(figures, hour, dlq, workers))
            return
        self._print_queues(figures)
        last = minutes[-1]
        self.stdout.write(
            f"\nattempts, last hour: {hour['delivered']:,} delivered, {hour['transient_error']:,} transient errors, "
            f"{hour['permanent_error']:,} permanent errors (last minute: {last.delivered:,} delivered, "
            f"{last.failed:,} failed)"
        )
        self.stdout.write(f"dead letters open: {dlq}")
        live = sum(1 for w in workers if w.alive)
        self.stdout.write(f"workers: {live} live, {len(workers) - live} stale")
        if workers:
            rows = [
                [
                    w.worker.kind, f"{w.worker.host}:{w.worker.pid}", "live" if w.alive else "STALE",
                    _age(w.seen_seconds_ago), f"{w.worker.processed:,}", ",".join(w.worker.queues or []) or "*",
                ]
                for w in workers
            ]  # fmt: skip
            for line in table(["kind", "process", "state", "seen", "processed", "queues"], rows):
                self.stdout.write("  " + line)

    def _print_queues(self, figures: list[dict[str, Any]]) -> None:
        if not figures:
            self.stdout.write("no live items in any queue")
            return
        headers = ["queue", "depth", "ready", "leased", "delayed", "oldest ready", *(f"p{p}" for p in PRIORITIES)]
        rows = []
        for q in [*figures, {**stats.totals(figures), "queue": "(all)"}] if len(figures) > 1 else figures:
            rows.append(
                [
                    q["queue"], f"{q['depth']:,}", f"{q['ready']:,}", f"{q['leased']:,}", f"{q['delayed']:,}",
                    _age(q["oldest_age_seconds"]), *(f"{q['by_priority'][p]:,}" for p in PRIORITIES),
                ]
            )  # fmt: skip
        for line in table(headers, rows):
            self.stdout.write(line)

    def _json(self, figures: list[dict[str, Any]], hour: dict[str, int], dlq: stats.Size, workers: list) -> str:
        return json.dumps(
            {
                "queues": figures,
                "attempts_last_hour": hour,
                "dlq_open": {"count": dlq.count, "exact": dlq.exact},
                "workers": [
                    {
                        "kind": w.worker.kind, "process": f"{w.worker.host}:{w.worker.pid}", "host": w.worker.host,
                        "pid": w.worker.pid, "alive": w.alive,
                        "seen_seconds_ago": round(w.seen_seconds_ago, 1), "processed": w.worker.processed,
                        "queues": w.worker.queues or [],
                    }
                    for w in workers
                ],
            }  # fmt: skip
        )
