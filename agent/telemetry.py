"""OpenTelemetry: exporter set-up from the standard variables, and the agent's own spans.

Temporal's plugin (`temporalio.contrib.opentelemetry`) traces the client start,
the workflow and every activity; the spans here add what only the agent knows,
named and attributed per OpenTelemetry's GenAI semantic conventions: one
`invoke_agent` span per turn, one `chat <model>` span per model call and one
`execute_tool <name>` span per tool call.

    OTEL_TRACES_EXPORTER   none (default) | console | otlp
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...   read by the SDK itself
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from agent.types import Usage

if TYPE_CHECKING:
    from agent.model import Reply

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


AGENT_NAME = "support-agent"


@contextmanager
def agent_span(model: str) -> Iterator[Span]:
    """The turn's `invoke_agent` span. Started in workflow code: the replay-safe
    tracer provider of Temporal's plugin neither duplicates nor re-ends it on replay."""
    with _tracer.start_as_current_span(
        f"invoke_agent {AGENT_NAME}",
        kind=SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT_NAME,
            "gen_ai.request.model": model or "(worker default)",
        },
    ) as span:
        yield span


def record_turn(span: Span, outcome: str, usage: Usage) -> None:
    span.set_attributes({"agent.outcome": outcome, "agent.model_calls": usage.model_calls})
    _set_usage(span, usage)


@contextmanager
def model_span(step: str, provider: str, model: str) -> Iterator[Span]:
    """A `chat <model>` span per the GenAI conventions; `record_reply` once it is in.
    A failed call gets `error.type` (the error's class) besides the recorded exception."""
    with _tracer.start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "agent.step": step,
        },
    ) as span:
        try:
            yield span
        except Exception as e:
            span.set_attribute("error.type", type(e).__name__)
            raise


def record_reply(span: Span, reply: Reply) -> None:
    _set_usage(span, reply.usage)
    if reply.finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
    if reply.response_model:
        span.set_attribute("gen_ai.response.model", reply.response_model)


def _set_usage(span: Span, usage: Usage) -> None:
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_input_tokens,
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
            "gen_ai.tool.type": "function",
        },
    ) as span:
        yield span
