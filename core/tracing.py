"""OpenTelemetry traces: one trace per notification, across the processes that handle it.

With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set when a process
starts, `configure()` sets up the SDK with a batching OTLP/HTTP (protobuf) exporter, and the hooks
emit spans; the exporter reads the other standard `OTEL_*` variables itself (headers, timeout,
`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_TRACES_SAMPLER`). `OTEL_SERVICE_NAME` names the service
(default `omnipost`). Unset, nothing is imported or started, and every hook is behind a test of
`ENABLED` at its call site (≈ 15 ns).

Nothing is stored to tie the processes together: a notification's trace id is its UUID (all 128
bits) and the span id of its root span ("notification.create", emitted by the web process) is the
first 8 bytes of a BLAKE2b hash of it. Any process can then attach spans to that trace as children
of the root, a remote parent it rebuilds from the id alone: the dispatcher's "notification.claim"
and "notification.send" (the send's id goes out in the webhook's `traceparent`), the web process's
"notification.receipt". Attributes never hold a recipient, a body or a secret.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("omnipost.tracing")

ENABLED = False  # set once, by configure() at a process's start: the hooks' call sites test it
DEFAULT_SERVICE_NAME = "omnipost"
SHUTDOWN_TIMEOUT_MILLIS = 5000  # a process's last spans, at exit: bounded, a collector may be down

_provider: Any = None
_tracer: Any = None
_ids: Any = None  # the IdGenerator that gives a root span its notification's ids
_api: Any = None  # opentelemetry.trace and .context, imported once tracing is on (`api()`)
_lock = threading.Lock()

Attributes = Mapping[str, str | bool | int | float]


def endpoint(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    """The OTLP endpoint traces go to; empty: none (tracing off)."""
    found = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return (found or "").strip()


def configure(role: str) -> bool:
    """At a process's start (`role`: web, dispatcher, scheduler): export traces if an OTLP endpoint is
    set. Returns whether tracing is on. Idempotent; the spans left are exported at exit (`shutdown`)."""
    global ENABLED, _provider, _tracer, _ids
    if not endpoint() or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ENABLED
    with _lock:
        if ENABLED:
            return True
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({
            "service.name": os.environ.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME,
            "omnipost.process": role,
            "process.pid": os.getpid(),
            "host.name": socket.gethostname(),
        })  # fmt: skip
        api()
        _ids = _id_generator()
        sampler = _sampler()
        _provider = TracerProvider(resource=resource, id_generator=_ids, shutdown_on_exit=False,
                                   **({"sampler": sampler} if sampler is not None else {}))  # fmt: skip
        _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # the endpoint etc. from OTEL_*
        _tracer = _provider.get_tracer("omnipost")
        import atexit
        from multiprocessing import util

        atexit.register(shutdown)
        # A multiprocessing child (a granian worker) ends in os._exit, past atexit; its finalizers run.
        util.Finalize(None, shutdown, exitpriority=100)
        ENABLED = True
    where = urlsplit(endpoint())  # without any user:password in it
    logger.info("exporting traces over OTLP to %s://%s as %s", where.scheme, where.hostname or "",
                resource.attributes["service.name"])  # fmt: skip
    return True


def shutdown() -> None:
    """Export the spans still buffered and stop the exporter, within SHUTDOWN_TIMEOUT_MILLIS whatever the
    collector does (the exporter's own retries and timeouts would hold a stopping process for longer)."""
    global ENABLED
    provider = _provider
    if provider is None or not ENABLED:
        return
    ENABLED = False

    def stop() -> None:
        try:
            provider.force_flush(SHUTDOWN_TIMEOUT_MILLIS)
            provider.shutdown()
        except Exception as exc:  # noqa: BLE001 - at exit: spans lost are logged, never a crash
            logger.warning("could not export the last spans: %s", exc)

    try:
        stopping = threading.Thread(target=stop, name="omnipost-trace-flush", daemon=True)
        stopping.start()
    except RuntimeError:  # no new thread this late in the interpreter's exit: in this one, unbounded
        stop()
        return
    stopping.join(SHUTDOWN_TIMEOUT_MILLIS / 1000)
    if stopping.is_alive():
        logger.warning("traces: the collector did not take the last spans within %d ms; they are dropped",
                       SHUTDOWN_TIMEOUT_MILLIS)  # fmt: skip


def api() -> Any:  # noqa: ANN401
    """The OpenTelemetry API modules the span functions use, imported on the first call (an import
    statement in each function would cost ≈ 1 µs a span)."""
    global _api
    if _api is None:
        from opentelemetry import context, trace

        _api = (trace, context)
    return _api


# --- ids ----------------------------------------------------------------------------------------------


def trace_id_of(notification_id: uuid.UUID | str) -> int:
    """The trace id of a notification: its UUID's 128 bits (never zero: a UUID's version bits are set)."""
    return (notification_id if isinstance(notification_id, uuid.UUID) else uuid.UUID(notification_id)).int


def root_span_id_of(notification_id: uuid.UUID | str) -> int:
    """The span id of a notification's root span: 64 bits of a hash of its UUID, never zero."""
    value = notification_id if isinstance(notification_id, uuid.UUID) else uuid.UUID(notification_id)
    return int.from_bytes(hashlib.blake2b(value.bytes, digest_size=8).digest(), "big") or 1


def traceparent(span: Any) -> str:  # noqa: ANN401 - an SDK span
    """The W3C `traceparent` naming `span`."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _id_generator() -> Any:  # noqa: ANN401
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class Ids(RandomIdGenerator):
        """Random ids, except for the root span being started on this thread (`forced`)."""

        def __init__(self) -> None:
            self.forced = threading.local()

        def generate_trace_id(self) -> int:
            ids = getattr(self.forced, "ids", None)
            return ids[0] if ids is not None else super().generate_trace_id()

        def generate_span_id(self) -> int:
            ids = getattr(self.forced, "ids", None)
            if ids is None:
                return super().generate_span_id()
            self.forced.ids = None
            return ids[1]

    return Ids()


def _sampler() -> Any:  # noqa: ANN401
    """`OTEL_TRACES_SAMPLER=[parentbased_]traceidratio` on the trace id's low 56 bits, or None (the SDK
    reads the variables itself). The SDK's ratio sampler reads the low 64 bits, whose top two are a
    UUID's variant (`10`): with trace ids that are notifications' UUIDs it would keep nothing at a
    ratio up to 0.5 and everything from 0.75. The low 56 bits are random in version 4 and 7 UUIDs."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if name not in ("traceidratio", "parentbased_traceidratio"):
        return None
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class LowBitsRatio(TraceIdRatioBased):
        TRACE_ID_LIMIT = (1 << 56) - 1

    try:
        rate = min(1.0, max(0.0, float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))))
    except ValueError:
        rate = 1.0
    return LowBitsRatio(rate) if name == "traceidratio" else ParentBased(LowBitsRatio(rate))


# --- spans ----------------------------------------------------------------------------------------------


def now() -> int:
    """A span's time: nanoseconds since the epoch."""
    return time.time_ns()


def _root_context(notification_id: uuid.UUID | str) -> Any:  # noqa: ANN401
    """A context whose current span is the notification's root, as a remote parent (its ids alone);
    sampled as the root itself was (the sampler's decision for the root depends on the trace id only)."""
    trace = _api[0]
    trace_id = trace_id_of(notification_id)
    sampled = _provider.sampler.should_sample(None, trace_id, "notification.create").decision.is_sampled()
    span_context = trace.SpanContext(
        trace_id, root_span_id_of(notification_id), is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT),
    )  # fmt: skip
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


Root = tuple[uuid.UUID | str, Attributes, uuid.UUID | str | None]  # a notification, its attributes, a related one


def roots(name: str, notifications: Sequence[Root], start_ns: int, end_ns: int) -> None:
    """A root span per notification, with the notification's trace and span ids, linked to the span
    current here (an HTTP request's, where one is traced) and to the root of the related notification."""
    trace, context = _api
    current = trace.get_current_span().get_span_context()
    request = [trace.Link(current)] if current.is_valid else []
    empty = context.Context()
    for notification_id, attributes, related in notifications:
        links = request
        if related is not None:
            links = [*request, trace.Link(trace.SpanContext(trace_id_of(related), root_span_id_of(related), True))]
        _ids.forced.ids = (trace_id_of(notification_id), root_span_id_of(notification_id))
        try:
            span = _tracer.start_span(name, context=empty, attributes=attributes, links=links or None,
                                      start_time=start_ns)  # fmt: skip
        finally:
            _ids.forced.ids = None
        span.end(end_ns)


def child(
    name: str,
    notification_id: uuid.UUID | str,
    start_ns: int,
    end_ns: int | None = None,
    attributes: Attributes | None = None,
    parent: Any = None,  # noqa: ANN401 - an SDK span; None: the notification's root
) -> Any:  # noqa: ANN401
    """A span in the notification's trace, child of `parent` or of the root; ended at `end_ns` if given,
    else left for `finish()`."""
    context = _root_context(notification_id) if parent is None else _api[0].set_span_in_context(parent)
    span = _tracer.start_span(name, context=context, attributes=attributes, start_time=start_ns)
    if end_ns is not None:
        span.end(end_ns)
    return span


def finish(span: Any, attributes: Attributes, *, error: str = "", end_ns: int | None = None) -> None:  # noqa: ANN401
    """End `span` with `attributes`; `error` (a code, never free text) marks it failed."""
    span.set_attributes(attributes)
    if error:
        trace = _api[0]
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end(end_ns)


def span(name: str, start_ns: int, end_ns: int, attributes: Attributes | None = None) -> None:
    """A span of its own (a new trace, or a child of the span current here): work that is no one
    notification's, such as a scheduler's batch."""
    _tracer.start_span(name, attributes=attributes, start_time=start_ns).end(end_ns)
