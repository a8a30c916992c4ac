"""A loopback OTLP/HTTP receiver: accepts `POST /v1/traces` (protobuf, as the OpenTelemetry SDK's
exporter sends it) and keeps the spans, decoded with the official `opentelemetry-proto` messages."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    resource: dict[str, Any]
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id)
    start_ns: int = 0
    end_ns: int = 0
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def service(self) -> str:
        return self.resource.get("service.name", "")


def _value(any_value: Any) -> Any:  # noqa: ANN401 - an AnyValue
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _attributes(key_values: Any) -> dict[str, Any]:  # noqa: ANN401
    return {kv.key: _value(kv.value) for kv in key_values}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(ReceivedSpan(
                        name=span.name, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(), resource=resource,
                        attributes=_attributes(span.attributes),
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
                        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                    ))  # fmt: skip
        with self._changed:
            self.requests += 1
            self.spans.extend(found)
            self._changed.notify_all()

    def wait_for(self, names: list[str], trace_id: str, timeout: float = 20.0) -> list[ReceivedSpan]:
        """The spans of `trace_id` once one of each of `names` has arrived (or whatever has, at `timeout`)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                spans = [s for s in self.spans if s.trace_id == trace_id]
                if all(any(s.name == name for s in spans) for name in names):
                    return spans
                left = deadline - time.monotonic()
                if left <= 0:
                    return spans
                self._changed.wait(min(left, 0.5))

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
