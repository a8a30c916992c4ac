"""core.tracing in this process, with the SDK's in-memory exporter in place of OTLP (the processes
and the OTLP wire are tests/ops/test_traces.py's): the ids a notification's trace gets from its UUID,
the root spans of a create (a fallback's linked to its notification's), the remote root that other
processes attach to, and a sampler's decision shared by all of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from core import tracing
from core.ids import uuid7
from tests.support.setups import PHONE, TOKEN

URL = "/api/v1/notifications"


def _install(monkeypatch: pytest.MonkeyPatch, sampler: object = None) -> tuple[TracerProvider, InMemorySpanExporter]:
    tracing.api()
    ids = tracing._id_generator()
    provider = TracerProvider(id_generator=ids, shutdown_on_exit=False, **({"sampler": sampler} if sampler else {}))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name, value in {"_provider": provider, "_tracer": provider.get_tracer("test"), "_ids": ids,
                        "ENABLED": True}.items():  # fmt: skip
        monkeypatch.setattr(tracing, name, value)
    return provider, exporter


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    provider, exporter = _install(monkeypatch)
    yield exporter
    provider.shutdown()


def test_a_notifications_ids():
    note = uuid.UUID("0190f0e0-1234-7abc-8def-0123456789ab")
    assert tracing.trace_id_of(note) == tracing.trace_id_of(str(note)) == note.int
    root = tracing.root_span_id_of(note)
    assert root == tracing.root_span_id_of(str(note)) and 0 < root < 2**64
    assert root != tracing.root_span_id_of(uuid.UUID("0190f0e0-1234-7abc-8def-0123456789ac"))


def test_every_process_attaches_to_the_same_root(exported):
    note = uuid.uuid4()
    tracing.roots("notification.create", [(note, {"omnipost.channel": "sms"}, None)], 10, 20)
    claim = tracing.child("notification.claim", note, 30, 40, {"omnipost.attempt": 1})
    send = tracing.child("notification.send", note, 50, None, {}, parent=claim)
    header = tracing.traceparent(send)
    tracing.finish(send, {"omnipost.outcome": "failed"}, error="http_400", end_ns=60)
    root, claimed, sent = exported.get_finished_spans()
    assert (root.context.trace_id, root.context.span_id) == (note.int, tracing.root_span_id_of(note))
    assert root.parent is None and root.start_time == 10 and root.end_time == 20
    assert claimed.parent.span_id == root.context.span_id and claimed.parent.is_remote
    assert sent.parent.span_id == claimed.context.span_id and sent.context.trace_id == note.int
    assert header == f"00-{note.int:032x}-{sent.context.span_id:016x}-01"
    assert sent.status.status_code.name == "ERROR" and sent.status.description == "http_400"
    # Ids are forced for the root alone: a later span on the same thread gets random ones.
    other = tracing.child("x", uuid.uuid4(), 1, 2)
    assert other.context.span_id not in (root.context.span_id, claimed.context.span_id)


@pytest.mark.django_db
def test_a_create_starts_a_trace_per_notification_a_fallbacks_linked(
    exported, api_a, setup_a, django_capture_on_commit_callbacks
):
    assert api_a.put("/api/v1/subscribers/user-1", {"phone": PHONE, "push_tokens": [TOKEN]},
                     format="json").status_code == 201  # fmt: skip
    body = {"channel": "push", "subscriber": "user-1", "body": "Code 4711",
            "fallback": [{"channel": "sms", "after_seconds": 300}]}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        response = api_a.post(URL, body, format="json")
        assert response.status_code == 201, response.content
        assert exported.get_finished_spans() == ()  # not before the rows are committed
    data = response.json()
    original, linked = uuid.UUID(data["id"]), uuid.UUID(data["fallback_notification_id"])
    spans = {span.context.trace_id: span for span in exported.get_finished_spans()}
    assert set(spans) == {original.int, linked.int}
    first, second = spans[original.int], spans[linked.int]
    assert first.name == second.name == "notification.create"
    assert first.context.span_id == tracing.root_span_id_of(original) and first.parent is None
    assert second.context.span_id == tracing.root_span_id_of(linked) and second.parent is None
    assert dict(first.attributes) == {"omnipost.channel": "push", "omnipost.status": "queued",
                                      "omnipost.provider_kind": setup_a.push.kind}  # fmt: skip
    assert second.attributes["omnipost.status"] == "scheduled" and not first.links
    [link] = second.links
    assert (link.context.trace_id, link.context.span_id) == (original.int, tracing.root_span_id_of(original))
    assert "Code 4711" not in str([dict(s.attributes) for s in spans.values()])


def test_a_sampler_decides_once_for_the_whole_trace(monkeypatch):
    """Ratio sampling keeps or drops a notification's trace whole: the root's decision depends on the
    trace id alone, and the remote root that other processes rebuild carries the same decision. The
    ratio is read from the ids' random bits: the SDK's own sampler, reading the UUID's variant bits
    too, would keep none at 0.5."""
    notes = [uuid7() for _ in range(40)] + [uuid.uuid4() for _ in range(40)]
    assert not any(TraceIdRatioBased(0.5).should_sample(None, n.int, "x").decision.is_sampled() for n in notes)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    sampler = tracing._sampler()
    assert isinstance(sampler, ParentBased)
    provider, exporter = _install(monkeypatch, sampler)
    kept = dropped = 0
    for note in notes:
        tracing.roots("notification.create", [(note, {}, None)], 1, 2)
        tracing.child("notification.claim", note, 3, 4)
        names = [s.name for s in exporter.get_finished_spans() if s.context.trace_id == note.int]
        assert names in ([], ["notification.create", "notification.claim"])
        kept, dropped = kept + bool(names), dropped + (not names)
    assert 20 <= kept <= 60 and kept + dropped == 80  # about half (the bound: 4.5 standard deviations)
    provider.shutdown()
