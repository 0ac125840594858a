"""OpenTelemetry: exporter set-up from the standard variables, and the agent's own spans.

Temporal's plugin (`temporalio.contrib.opentelemetry`) traces the client start,
the workflow and every activity; the spans here add what only the agent knows:
one span per model call with the `gen_ai.*` attributes of the semantic
conventions, and one per tool call.

    OTEL_TRACES_EXPORTER   none (default) | console | otlp
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...   read by the SDK itself
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from agent.types import Usage

_tracer = trace.get_tracer("durable_agent")


@functools.cache
def tracing_plugins() -> list[Any]:
    """Temporal client plugins for tracing, per `OTEL_TRACES_EXPORTER` (none by default).

    Sets the global tracer provider on first use; later calls return the same plugins.
    """
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter_name in ("", "none"):
        return []
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, create_tracer_provider

    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise SystemExit(
                "OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter: "
                "pip install -e '.[otlp]' (or unset OTEL_TRACES_EXPORTER)"
            ) from None
        exporter = OTLPSpanExporter()
    else:
        raise SystemExit(
            f"OTEL_TRACES_EXPORTER={exporter_name!r} is not supported: use none, console or otlp"
        )
    service = os.environ.get("OTEL_SERVICE_NAME", "durable-agent")
    provider = create_tracer_provider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return [OpenTelemetryPlugin(add_temporal_spans=True)]


@contextmanager
def model_span(operation: str, system: str, model: str) -> Iterator[Span]:
    """A `chat <model>` span; call `record_usage` on it once the reply is in."""
    with _tracer.start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.system": system,
            "gen_ai.request.model": model,
            "agent.step": operation,
        },
    ) as span:
        yield span


def record_usage(span: Span, usage: Usage) -> None:
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
        }
    )


@contextmanager
def tool_span(name: str, call_id: str) -> Iterator[Span]:
    with _tracer.start_as_current_span(
        f"execute_tool {name}",
        kind=SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
        },
    ) as span:
        yield span
