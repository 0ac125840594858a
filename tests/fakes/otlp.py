"""An OTLP/HTTP receiver on loopback: what a collector would get, decoded for assertions.

    with OtlpReceiver() as otlp:          # env: OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint
        ...
        otlp.spans()                      # every span received so far, flattened
        otlp.metric_names()

Accepts `/v1/traces` and `/v1/metrics` as protobuf (gzip or not), as the Python
SDK's exporter and Temporal Core's send them, and answers 200 like a collector.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto

KINDS = {
    SpanProto.SPAN_KIND_INTERNAL: "internal",
    SpanProto.SPAN_KIND_SERVER: "server",
    SpanProto.SPAN_KIND_CLIENT: "client",
    SpanProto.SPAN_KIND_PRODUCER: "producer",
    SpanProto.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class Span:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    """Empty for a root span."""
    service: str
    attributes: dict[str, Any] = field(hash=False)
    events: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False, compare=False)
    """By name (the last of a name): `exception`, `model_fallback`, ..."""
    status: str = field(default="", compare=False)
    """The status's description (an error's), empty when none."""


def _value(kv: KeyValue) -> Any:
    v = kv.value
    which = v.WhichOneof("value")
    if which == "array_value":
        return [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
    return getattr(v, which) if which else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv) for kv in kvs}


class OtlpReceiver:
    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request: Any
                if self.path == "/v1/traces":
                    request, store = ExportTraceServiceRequest(), receiver.traces
                elif self.path == "/v1/metrics":
                    request, store = ExportMetricsServiceRequest(), receiver.metrics
                else:
                    self.send_error(404)
                    return
                request.ParseFromString(body)
                with receiver._lock:
                    store.append(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def spans(self) -> list[Span]:
        with self._lock:
            requests = list(self.traces)
        found = []
        for request in requests:
            for rs in request.resource_spans:
                service = str(attributes(rs.resource.attributes).get("service.name", ""))
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        found.append(
                            Span(
                                name=s.name,
                                kind=KINDS.get(s.kind, str(s.kind)),
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(),
                                service=service,
                                attributes=attributes(s.attributes),
                                events={e.name: attributes(e.attributes) for e in s.events},
                                status=s.status.message,
                            )
                        )
        return found

    def metric_points(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Data points by metric name: (attributes, point), newest request last."""
        with self._lock:
            requests = list(self.metrics)
        points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        for request in requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = getattr(m, m.WhichOneof("data"))
                        for p in data.data_points:
                            points.setdefault(m.name, []).append((attributes(p.attributes), p))
        return points

    def wait_for(self, what: Callable[[], bool], timeout: float = 30, what_for: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, f"not received in {timeout:g} s: {what_for}"
            time.sleep(0.1)
