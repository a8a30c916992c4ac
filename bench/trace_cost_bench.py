"""What traces (core.tracing) cost, per notification, in CPU.

    .venv/bin/python bench/trace_cost_bench.py [-n 20000] [--repeat 5]

Unset (no OTLP endpoint): each hook site is a test of `tracing.ENABLED`; this times that test and the
`OutboundMessage` field it fills (`traceparent=""`), in nanoseconds, best of `repeat`.

Set: the spans of one notification's life — its root (`notification.create`), a claim and a send
with its `traceparent` and outcome (the dispatcher), a receipt — made through the same functions
the hooks call, into the SDK's batch processor with an exporter that drops them, then their OTLP
protobuf encoding (what the exporter's thread does before the POST), in microseconds per
notification. CPU time (`time.process_time`, every thread), best of `repeat`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import timeit
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def unset_costs(repeat: int) -> dict[str, float]:
    from core import tracing
    from providers.kinds.base import OutboundMessage

    assert not tracing.ENABLED
    number = 1_000_000
    env = {"tracing": tracing, "OutboundMessage": OutboundMessage, "nid": str(uuid.uuid4()), "md": {},
           "now": datetime.now(UTC), "tp": ""}  # fmt: skip

    def ns(stmt: str, n: int = number) -> float:
        return min(timeit.repeat(stmt, number=n, repeat=repeat, globals=env, timer=time.process_time)) / n * 1e9

    empty = ns("pass")
    message = ("OutboundMessage(notification_id=nid, tenant_id='t', channel='webhook', recipient='r', subject='', "
               "body='b', metadata=md, created_at=now, attempt=1, headers=())")  # fmt: skip
    plain, filled = ns(message, 200_000), ns(message[:-1] + ", traceparent=tp)", 200_000)
    return {
        "if tracing.ENABLED: (ns)": ns("if tracing.ENABLED: pass") - empty,
        "tracing.now() if tracing.ENABLED else 0 (ns)": ns("x = tracing.now() if tracing.ENABLED else 0") - empty,
        "OutboundMessage(..., traceparent='') extra (ns)": filled - plain,
    }


def set_costs(n: int, repeat: int) -> dict[str, float]:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from core import tracing

    kept: list = []

    class Keep(SpanExporter):
        def export(self, spans):  # noqa: ANN001, ANN202
            kept.extend(spans)
            return SpanExportResult.SUCCESS

    tracing.api()
    ids = tracing._id_generator()
    provider = TracerProvider(id_generator=ids, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(Keep(), max_queue_size=n * 5, max_export_batch_size=512))
    tracing._provider, tracing._tracer, tracing._ids, tracing.ENABLED = provider, provider.get_tracer("b"), ids, True

    def life(note: uuid.UUID) -> None:
        t = tracing.now()
        tracing.roots("notification.create", [(note, {"omnipost.channel": "webhook", "omnipost.status": "queued",
                                                      "omnipost.provider_kind": "webhook"}, None)], t, t)  # fmt: skip
        attributes = {"omnipost.provider_kind": "webhook", "omnipost.channel": "webhook", "omnipost.attempt": 1}
        key = str(note)
        claim = tracing.child("notification.claim", key, t, t, attributes)
        send = tracing.child("notification.send", key, tracing.now(), None, attributes, parent=claim)
        tracing.traceparent(send)
        tracing.finish(send, {"omnipost.outcome": "delivered", "http.response.status_code": 200})
        tracing.child("notification.receipt", note, t, t, {"omnipost.provider_kind": "webhook",
                      "omnipost.receipt_type": "delivered", "omnipost.receipt": "delivered",
                      "omnipost.receipt_changed": True})  # fmt: skip

    made, encoded = [], []
    for _ in range(repeat):
        notes = [uuid.uuid4() for _ in range(n)]
        kept.clear()
        start = time.process_time()
        for note in notes:
            life(note)
        provider.force_flush()
        made.append((time.process_time() - start) / n * 1e6)
        spans = list(kept)
        start = time.process_time()
        for i in range(0, len(spans), 512):
            encode_spans(spans[i : i + 512]).SerializeToString()
        encoded.append((time.process_time() - start) / n * 1e6)
    provider.shutdown()
    tracing.ENABLED = False
    return {
        "spans of one notification, made and batched (µs)": min(made),
        "their OTLP protobuf encoding (µs)": min(encoded),
        "spans per notification": len(spans) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20000, help="notifications per run (tracing set)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[name]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings")
    os.environ.setdefault("DEBUG", "true")
    import django

    django.setup()
    for title, figures in (("unset", unset_costs(args.repeat)), ("set", set_costs(args.n, args.repeat))):
        print(f"tracing {title}:")
        for name, value in figures.items():
            print(f"  {name:52} {value:8.2f}")


if __name__ == "__main__":
    main()
