"""OpenTelemetry: exporter set-up from the standard variables, and the agent's own spans.

Temporal's plugin (`temporalio.contrib.opentelemetry`) traces the client start,
the workflow and every activity; the spans here add what only the agent knows,
named and attributed per OpenTelemetry's GenAI semantic conventions: a root span
per client command (`client.py ask`), one `invoke_agent` span per turn, one
`chat <model>` span per model call and one `execute_tool <name>` span per tool
call. The worker's `ActivityAttempts` (`durable_agent.runtime.attempts`) marks each
activity attempt's span with its attempt number and, when it failed, `error.type`, so
a retried call reads as one span per attempt.

    OTEL_TRACES_EXPORTER   none (default) | console | otlp
    OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_BSP_*, ...   read by the SDK itself

Spans leave in batches, so every process calls `flush()` before it exits (the
CLI ends with `os._exit`, which runs no exit handler). A worker killed outright
loses the spans of its last second (the batch delay here, unless
OTEL_BSP_SCHEDULE_DELAY says otherwise); replays elsewhere add none twice.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode
from temporalio.exceptions import ApplicationError

from durable_agent import redact
from durable_agent.pricing import cost_of
from durable_agent.types import Usage

if TYPE_CHECKING:
    from durable_agent.model import Reply
    from durable_agent.model_settings import ModelSettings

_tracer = trace.get_tracer("durable_agent")


BATCH_DELAY_MS = 1000
"""How long finished spans wait to be sent (the SDK's default is 5 s): what a worker
killed outright can lose."""


@functools.cache
def tracer_provider() -> Any | None:
    """The process's tracer provider per `OTEL_TRACES_EXPORTER` (none by default),
    set as the global one on first use; None when tracing is off."""
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter_name in ("", "none"):
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from temporalio.contrib.opentelemetry import create_tracer_provider

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
    delay = None if os.environ.get("OTEL_BSP_SCHEDULE_DELAY") else BATCH_DELAY_MS
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=delay))
    trace.set_tracer_provider(provider)
    return provider


def tracing_plugins() -> list[Any]:
    """Temporal client plugins for tracing: none when tracing is off."""
    if tracer_provider() is None:
        return []
    from temporalio.contrib.opentelemetry import OpenTelemetryPlugin

    quiet = logging.getLogger("opentelemetry.context")
    if not any(isinstance(f, EvictedWorkflowDetach) for f in quiet.filters):
        quiet.addFilter(EvictedWorkflowDetach())
    return [OpenTelemetryPlugin(add_temporal_spans=True)]


class EvictedWorkflowDetach(logging.Filter):
    """Leaves out OpenTelemetry's "Failed to detach context" for a workflow the worker
    let go of mid-way (it stops, its cache is full, the workflow was terminated), and
    for that alone. The agent's own turn span ends where it opens (`agent_span`); the
    span of Temporal's plugin around the whole workflow run (`RunWorkflow`) is a `with`
    across the workflow's awaits in the SDK's code. When the worker lets go of the
    workflow, garbage collection closes the workflow's coroutine in another
    `contextvars.Context`, where the token is not valid and there is nothing to detach
    (the SDK's own `temporalio.contrib.opentelemetry._context` says as much, and
    guards its own attach so): the log was a traceback per turn in flight, and a false
    alarm. Known by its cause: a ValueError for a token of another Context, raised as
    a generator was closed (GeneratorExit)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (
            record.getMessage() == "Failed to detach context"
            and isinstance(error, ValueError)
            and "created in a different Context" in str(error)
            and isinstance(error.__context__, GeneratorExit)
        )


def flush(timeout_s: float = 5.0) -> None:
    """Send every finished span now. Call before the process exits, whichever way."""
    # Only a provider this process set up: flushing must not start tracing.
    if tracer_provider.cache_info().currsize and (provider := tracer_provider()) is not None:
        provider.force_flush(int(timeout_s * 1000))


_UNRECORDED: dict[str, Any] = {"record_exception": False, "set_status_on_exception": False}
"""A span opened with these records no exception itself: `_errors_on` does, masked."""


@contextmanager
def _errors_on(span: Span) -> Iterator[None]:
    """What OpenTelemetry records of an error raised inside a span (for an `Exception`,
    not a cancellation), masked, and `error.type` for either."""
    try:
        yield
    except Exception as e:
        record_error(span, e)
        raise
    except BaseException as e:
        span.set_attribute("error.type", error_type(e))
        raise


def record_error(span: Span, e: BaseException) -> None:
    """A failure on its span as OpenTelemetry records one (`error.type`, an `exception`
    event, an error status), its text and traceback with credentials masked
    (`durable_agent.redact`): a trace is no place for an API key either."""
    span.set_attribute("error.type", error_type(e))
    said = redact.mask(str(e))
    span.add_event(
        "exception",
        {
            "exception.type": type(e).__name__,
            "exception.message": said,
            "exception.stacktrace": redact.mask("".join(traceback.format_exception(e))),
            "exception.escaped": True,
        },
    )
    span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {said}"))


@contextmanager
def command_span(name: str) -> Iterator[Span]:
    """The root span of one client command (`client.py ask`): the turns it starts are
    its children, so a turn's trace begins where the person asked."""
    tracer_provider()
    with (
        _tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, **_UNRECORDED) as span,
        _errors_on(span),
    ):
        yield span


def error_type(e: BaseException) -> str:
    """`error.type`: an ApplicationError's own type (`NotFound`, `ModelUnavailable`),
    else the exception's class name."""
    if isinstance(e, ApplicationError) and e.type:
        return e.type
    return type(e).__name__


@contextmanager
def agent_span(agent: str, model: str, conversation_id: str = "") -> Iterator[Span]:
    """The turn's `invoke_agent <agent>` span. Started in workflow code: the replay-safe
    tracer provider of Temporal's plugin neither duplicates nor re-ends it on replay.
    A chat's turns carry `gen_ai.conversation.id`: the conversation's workflow id. A
    turn that names no agent gets its name when the worker has resolved it."""
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.request.model": model or "(worker default)",
    }
    if agent:
        attributes["gen_ai.agent.name"] = agent
    if conversation_id:
        attributes["gen_ai.conversation.id"] = conversation_id
    span = _tracer.start_span(
        f"invoke_agent {agent}".strip(), kind=SpanKind.INTERNAL, attributes=attributes
    )
    # Current for the turn's own code, so the activities it starts are its children.
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except GeneratorExit:
        # The worker let go of the turn mid-way (it stops, its cache is full, the turn
        # was terminated): garbage collection closes the turn's code wherever it runs,
        # where the token is not valid. Nothing to detach (the turn's task is gone),
        # and the span stays open, as the turn does: the worker that runs it next ends
        # it. `start_as_current_span` detached here, and logged "Failed to detach
        # context" with a traceback for every such turn.
        raise
    except BaseException as e:
        otel_context.detach(token)
        record_error(span, e)
        span.end()
        raise
    otel_context.detach(token)
    span.end()


def record_turn(span: Span, agent: str, outcome: str, usage: Usage) -> None:
    if agent:
        span.update_name(f"invoke_agent {agent}")
        span.set_attribute("gen_ai.agent.name", agent)
    span.set_attributes({"agent.outcome": outcome, "agent.model_calls": usage.model_calls})
    _set_usage(span, usage)
    record_cost(span, cost_of(usage))


def record_fallback(span: Span | None, failed: str, then: str, reason: str, error: str) -> None:
    """On the turn's span: a model failed for good and the next got the request (the
    calls themselves are `chat <model>` spans, the failed ones with `error.type`).
    `reason`: the failure's class, as the turn's story says it; `error`: its text, masked
    here (the story never shows it)."""
    if span is None:
        return
    span.add_event(
        "model_fallback",
        {
            "agent.model.failed": failed,
            "agent.model.next": then,
            "agent.model.reason": reason,
            "agent.model.error": redact.mask(error),
        },
    )


def record_failure(span: Span | None, reason: str, error: str) -> None:
    """On the turn's span: what ended the turn, as its answer says it (`reason`, a fixed
    sentence per kind of failure), and the error's own text, masked (`error`), which
    the answer and steps never show."""
    if span is None:
        return
    span.add_event(
        "turn_failure", {"agent.failure.reason": reason, "agent.failure.error": redact.mask(error)}
    )


def record_cost(span: Span, cost: float | None) -> None:
    """`agent.cost_usd`, when the price is known (no attribute means unknown)."""
    if cost is not None:
        span.set_attribute("agent.cost_usd", cost)


@contextmanager
def model_span(step: str, provider: str, model: str) -> Iterator[Span]:
    """A `chat <model>` span per the GenAI conventions; `record_reply` once it is in.
    A failed call gets `error.type` (the error's class) besides the recorded exception."""
    with (
        _tracer.start_as_current_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
                "agent.step": step,
            },
            **_UNRECORDED,
        ) as span,
        _errors_on(span),
    ):
        yield span


def record_reply(span: Span, reply: Reply) -> None:
    _set_usage(span, reply.usage)
    if reply.finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
    if reply.response_model:
        span.set_attribute("gen_ai.response.model", reply.response_model)


SETTING_ATTRIBUTES = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "max_tokens": "gen_ai.request.max_tokens",
    "stop": "gen_ai.request.stop_sequences",
    "seed": "gen_ai.request.seed",
    "reasoning_effort": "gen_ai.request.reasoning.level",
    "parallel_tool_calls": "agent.request.parallel_tool_calls",
}
"""A model call's settings on its span: the GenAI semantic conventions' names where
they have one."""


def record_settings(
    span: Span, settings: ModelSettings | None, ignored: Mapping[str, str] | None = None
) -> None:
    """What the call sent of its settings (`SETTING_ATTRIBUTES`; the names of its
    extras, not their values, in `agent.request.extra`), and what its backend did not
    send (`agent.request.settings_ignored`)."""
    if settings is None:
        return
    skipped = set(ignored or ())
    for name, attribute in SETTING_ATTRIBUTES.items():
        value = getattr(settings, name)
        if value is not None and name not in skipped:
            span.set_attribute(attribute, value)
    if settings.extra and "extra" not in skipped:
        span.set_attribute("agent.request.extra", sorted(settings.extra))
    if skipped:
        span.set_attribute("agent.request.settings_ignored", sorted(skipped))


def _set_usage(span: Span, usage: Usage) -> None:
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_input_tokens,
            "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
        }
    )


@contextmanager
def tool_span(name: str, call_id: str) -> Iterator[Span]:
    with (
        _tracer.start_as_current_span(
            f"execute_tool {name}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
            },
            **_UNRECORDED,
        ) as span,
        _errors_on(span),
    ):
        yield span


_attempt_span: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar(
    "durable_agent_attempt_span", default=None
)


def attempt_span_context() -> SpanContext | None:
    """The span of the activity attempt running in this task, even once that span has
    ended: the SDK logs an attempt's failure after its span is closed."""
    return _attempt_span.get()


def note_attempt(span: Span) -> None:
    """Keeps `span` as this task's activity attempt (`attempt_span_context`). Never
    reset: it lives as long as the attempt's task does."""
    _attempt_span.set(span.get_span_context())
