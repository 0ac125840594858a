"""Metrics: Temporal's own and the agent's, from one pipeline.

The worker's Temporal `Runtime` gets the exporter (`worker_runtime`), so the SDK
exports its own `temporal_*` series, and the agent's instruments below, recorded
through the SDK's metric meters (`activity.metric_meter()`,
`workflow.metric_meter()`), leave the same way with the same labels (namespace,
task queue, workflow and activity type). A workflow's meter records nothing
while the workflow replays, so a worker crash never counts a turn twice. An
activity that ran twice (its worker died before reporting) counts twice: the
model was called, and paid, twice.

    --metrics-port [HOST:]PORT, AGENT_METRICS_PORT   Prometheus text on /metrics (host: 127.0.0.1)
    OTEL_METRICS_EXPORTER=prometheus                 the same on OTEL_EXPORTER_PROMETHEUS_HOST/PORT
    OTEL_METRICS_EXPORTER=otlp                       to an OTLP endpoint instead:
        OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT, _PROTOCOL (http/protobuf or grpc), _HEADERS,
        OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, OTEL_METRIC_EXPORT_INTERVAL (ms)

The agent's instruments, named per OpenTelemetry's GenAI conventions where they
have a name (Prometheus cannot take dots, so there every dot is `_`:
`gen_ai_client_token_usage{gen_ai_token_type="input"}`):

    gen_ai.client.token.usage         histogram  tokens per model call, by gen_ai.token.type
                                                 (input, output), provider and model
    gen_ai.client.operation.duration  histogram  seconds per model call (error.type if it failed)
    agent.model_call.cost_usd         histogram  US dollars per model call with a known price;
                                                 its count next to the duration's shows the unpriced
    agent.tool.calls                  counter    tool call attempts by gen_ai.tool.name and
                                                 agent.tool.result (ok, tool_error,
                                                 retryable_error, cancelled) and error.type
    agent.model.fallbacks             counter    requests a model failed for good, handed to the
                                                 next model (agent.model.failed, agent.model.next)
    agent.turns                       counter    turns by agent.outcome
    agent.turn.model_calls            histogram  model calls per turn
    agent.turn.steps                  histogram  rounds of tool calls per turn
    agent.turn.cost_usd               histogram  US dollars per turn whose cost is known
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

from temporalio import activity, workflow
from temporalio.common import MetricHistogram, MetricHistogramFloat, MetricMeter
from temporalio.exceptions import ApplicationError
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    OpenTelemetryConfig,
    OpenTelemetryMetricTemporality,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from durable_agent.pricing import cost_of, format_cost
from durable_agent.runtime import runtimes
from durable_agent.runtime import settings as settings_
from durable_agent.telemetry import error_type
from durable_agent.types import Step, StepKind, TurnOutput, Usage

PORT_SETTING = "AGENT_METRICS_PORT"
DEFAULT_HOST = "127.0.0.1"
"""Where `--metrics-port PORT` listens: nothing here authenticates callers. In a
container give `0.0.0.0:PORT` so a scraper outside can reach it."""


class MetricsConfigError(ValueError):
    """The metrics settings contradict each other or cannot be read."""


@dataclass(frozen=True)
class Instrument:
    name: str
    """The OpenTelemetry name (dots); Prometheus gets it with underscores."""
    description: str
    unit: str
    buckets: tuple[float, ...] = ()
    """Histogram bucket bounds; the GenAI conventions' advice where they give one."""


TOKEN_USAGE = Instrument(
    "gen_ai.client.token.usage",
    "Tokens used per model call (input includes cached input)",
    "{token}",
    (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304),
)
OPERATION_DURATION = Instrument(
    "gen_ai.client.operation.duration",
    "Duration of a model call",
    "s",
    (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
)
_COST_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5)
MODEL_CALL_COST = Instrument(
    "agent.model_call.cost_usd", "Price of a model call", "USD", _COST_BUCKETS
)
TOOL_CALLS = Instrument("agent.tool.calls", "Tool call attempts", "{call}")
TURNS = Instrument("agent.turns", "Turns ended, by outcome", "{turn}")
FALLBACKS = Instrument(
    "agent.model.fallbacks", "Requests a model failed for good, given to the next", "{request}"
)
TURN_MODEL_CALLS = Instrument(
    "agent.turn.model_calls", "Model calls per turn", "{call}", (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
)
TURN_STEPS = Instrument(
    "agent.turn.steps", "Rounds of tool calls per turn", "{step}", (0, 1, 2, 3, 4, 6, 8, 10, 20, 50)
)
TURN_COST = Instrument("agent.turn.cost_usd", "Price of a turn", "USD", _COST_BUCKETS)
HISTOGRAMS = (
    TOKEN_USAGE,
    OPERATION_DURATION,
    MODEL_CALL_COST,
    TURN_MODEL_CALLS,
    TURN_STEPS,
    TURN_COST,
)


@dataclass
class _Names:
    """OTLP takes the conventions' dotted names; Prometheus refuses dots. Set once,
    when the worker's runtime is built, before any metric is recorded."""

    dotted: bool = False

    def __call__(self, name: str) -> str:
        return name if self.dotted else name.replace(".", "_")

    def attributes(self, attrs: Mapping[str, str | int]) -> dict[str, str | int]:
        return {self(k): v for k, v in attrs.items()}


_names = _Names()


# -- the worker's runtime -------------------------------------------------------------


@dataclass(frozen=True)
class MetricsSettings:
    """Where the worker's metrics go: a Prometheus endpoint, an OTLP one, or nowhere."""

    prometheus: str | None = None
    """`host:port` to serve /metrics on."""
    otlp_url: str | None = None
    otlp_http: bool = True
    otlp_headers: dict[str, str] = field(default_factory=dict)
    otlp_interval: timedelta | None = None
    otlp_delta: bool = False

    @property
    def active(self) -> bool:
        return bool(self.prometheus or self.otlp_url)

    @classmethod
    def from_env(
        cls, port: str | None = None, env: Mapping[str, str] = os.environ
    ) -> MetricsSettings:
        """From `--metrics-port` (`port`), else AGENT_METRICS_PORT, and OTEL_METRICS_EXPORTER."""
        port = port or env.get(PORT_SETTING, "").strip() or None
        exporter = env.get("OTEL_METRICS_EXPORTER", "").strip().lower()
        if exporter in ("", "none"):
            return cls(prometheus=_bind_address(port)) if port else cls()
        if exporter == "prometheus":
            host = env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
            return cls(
                prometheus=_bind_address(
                    port or env.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"), host
                )
            )
        if exporter != "otlp":
            raise MetricsConfigError(
                f"OTEL_METRICS_EXPORTER={exporter!r} is not supported: use none, prometheus or otlp"
            )
        if port:
            raise MetricsConfigError(
                "--metrics-port (AGENT_METRICS_PORT) serves Prometheus, and "
                "OTEL_METRICS_EXPORTER=otlp sends the same metrics to a collector instead: "
                "use one of them"
            )
        return cls._otlp(env)

    @classmethod
    def _otlp(cls, env: Mapping[str, str]) -> MetricsSettings:
        def setting(name: str) -> str:
            return env.get(f"OTEL_EXPORTER_OTLP_METRICS_{name}") or env.get(
                f"OTEL_EXPORTER_OTLP_{name}", ""
            )

        protocol = setting("PROTOCOL").strip() or "http/protobuf"
        if protocol not in ("http/protobuf", "grpc"):
            raise MetricsConfigError(
                f"OTLP protocol {protocol!r} is not supported for metrics: "
                "use http/protobuf or grpc"
            )
        http = protocol == "http/protobuf"
        url = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "").strip()
        if not url:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            base = base or ("http://localhost:4318" if http else "http://localhost:4317")
            url = base.rstrip("/") + "/v1/metrics" if http else base
        interval = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
        if interval and not interval.isdigit():
            raise MetricsConfigError(
                f"OTEL_METRIC_EXPORT_INTERVAL={interval!r} is not a number of milliseconds"
            )
        temporality = (
            env.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "").strip().lower()
        )
        return cls(
            otlp_url=url,
            otlp_http=http,
            otlp_headers=_headers(setting("HEADERS")),
            otlp_interval=timedelta(milliseconds=float(interval)) if interval else None,
            otlp_delta=temporality == "delta",
        )


def _bind_address(value: str, host: str = DEFAULT_HOST) -> str:
    given_host, _, port = value.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise MetricsConfigError(
            f"metrics port {value!r} is not a port: give PORT or HOST:PORT, "
            "e.g. 9464 or 0.0.0.0:9464"
        )
    return f"{given_host or host}:{port}"


def _headers(text: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (values URL-encoded), as OTEL_EXPORTER_OTLP_HEADERS has them."""
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {unquote(k.strip()): unquote(v.strip()) for k, v in pairs}


def worker_runtime(settings: MetricsSettings, core_logger: logging.Logger | None = None) -> Runtime:
    """The worker's Temporal runtime: metrics per `settings`, and Core's own log lines
    (warnings and errors) forwarded to `core_logger` so they share the worker's format."""
    _names.dotted = settings.otlp_url is not None
    buckets = {_names(i.name): list(i.buckets) for i in HISTOGRAMS}
    metrics: PrometheusConfig | OpenTelemetryConfig | None = None
    if settings.prometheus:
        metrics = PrometheusConfig(
            bind_address=settings.prometheus, histogram_bucket_overrides=buckets
        )
    elif settings.otlp_url:
        metrics = OpenTelemetryConfig(
            url=settings.otlp_url,
            headers=settings.otlp_headers,
            http=settings.otlp_http,
            metric_periodicity=settings.otlp_interval,
            metric_temporality=OpenTelemetryMetricTemporality.DELTA
            if settings.otlp_delta
            else OpenTelemetryMetricTemporality.CUMULATIVE,
            histogram_bucket_overrides=buckets,
        )
    logging_config = LoggingConfig(
        filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=core_logger) if core_logger else None,
    )
    service = os.environ.get("OTEL_SERVICE_NAME", "durable-agent")
    telemetry = TelemetryConfig(
        logging=logging_config,
        metrics=metrics,
        # The service's name on every series (Prometheus) or on the resource (OTLP).
        global_tags={"service_name": service} if settings.prometheus else {"service.name": service},
        attach_service_name=False,
    )
    try:
        runtime = Runtime(telemetry=telemetry, worker_heartbeat_interval=settings_.WORKER_HEARTBEAT)
    except ValueError as e:  # the port is taken, the endpoint is no URL
        fix = (
            "choose another --metrics-port (AGENT_METRICS_PORT)"
            if settings.prometheus
            else "check OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT"
        )
        where = settings.prometheus or settings.otlp_url
        raise MetricsConfigError(f"cannot send metrics to {where}: {e}; {fix}") from None
    # Its threads forward Core's log lines into Python: they must end before the
    # interpreter does (`runtimes.end`, at exit).
    return runtimes.track(runtime)


async def drain(settings: MetricsSettings) -> None:
    """Before the process exits: give the OTLP exporter one more period to send what the
    last turns recorded (Core exports on a timer and has no flush to call)."""
    if settings.otlp_url:
        period = settings.otlp_interval or timedelta(seconds=1)
        await asyncio.sleep(period.total_seconds() * 1.5)


# -- recording ------------------------------------------------------------------------


def _histogram(meter: MetricMeter, i: Instrument) -> MetricHistogram:
    return meter.create_histogram(_names(i.name), i.description, i.unit)


def _float_histogram(meter: MetricMeter, i: Instrument) -> MetricHistogramFloat:
    return meter.create_histogram_float(_names(i.name), i.description, i.unit)


@dataclass
class ModelCallRecord:
    """What `model_call` records when its block ends; the block fills it in."""

    usage: Usage | None = None
    cost: float | None = None


@contextmanager
def model_call(provider: str, model: str, agent: str = "") -> Iterator[ModelCallRecord]:
    """Time one model call (in an activity) and record its tokens, duration and price."""
    record = ModelCallRecord()
    attrs: dict[str, str | int] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        "gen_ai.agent.name": agent,
    }
    started = time.perf_counter()
    try:
        yield record
    except BaseException as e:
        _record_model_call(attrs | {"error.type": error_type(e)}, started, record)
        raise
    _record_model_call(attrs, started, record)


def _record_model_call(
    attrs: dict[str, str | int], started: float, record: ModelCallRecord
) -> None:
    meter = activity.metric_meter()
    _float_histogram(meter, OPERATION_DURATION).record(
        time.perf_counter() - started, _names.attributes(attrs)
    )
    if record.usage is not None:
        tokens = _histogram(meter, TOKEN_USAGE)
        base = {k: v for k, v in attrs.items() if k != "error.type"}
        for kind, count in (
            ("input", record.usage.input_tokens),
            ("output", record.usage.output_tokens),
        ):
            tokens.record(count, _names.attributes(base | {"gen_ai.token.type": kind}))
    if record.cost is not None:
        priced = {k: v for k, v in attrs.items() if k != "gen_ai.operation.name"}
        _float_histogram(meter, MODEL_CALL_COST).record(record.cost, _names.attributes(priced))


@contextmanager
def tool_call(tool: str, agent: str = "") -> Iterator[None]:
    """Count one tool call attempt (in the dispatch activity) by its result."""
    try:
        yield
    except asyncio.CancelledError:
        _count_tool_call(tool, agent, "cancelled", "")
        raise
    except Exception as e:
        permanent = isinstance(e, ApplicationError) and e.non_retryable
        result = "tool_error" if permanent else "retryable_error"
        _count_tool_call(tool, agent, result, error_type(e))
        raise
    _count_tool_call(tool, agent, "ok", "")


def _count_tool_call(tool: str, agent: str, result: str, error: str) -> None:
    attrs: dict[str, str | int] = {
        "gen_ai.tool.name": tool,
        "gen_ai.agent.name": agent,
        "agent.tool.result": result,
    }
    if error:
        attrs["error.type"] = error
    meter = activity.metric_meter()
    meter.create_counter(_names(TOOL_CALLS.name), TOOL_CALLS.description, TOOL_CALLS.unit).add(
        1, _names.attributes(attrs)
    )


def tool_rounds(steps: Sequence[Step]) -> int:
    """Rounds of tool calls the turn ran (or refused, or asked consent for)."""
    ran = (StepKind.TOOL_CALL, StepKind.REJECTED, StepKind.APPROVAL)
    return len({s.iteration for s in steps if s.kind in ran})


def record_turn(turn: TurnOutput) -> None:
    """In workflow code, as the turn ends: its outcome, model calls, steps and cost,
    and one log line. Nothing is recorded or logged while the workflow replays."""
    meter = workflow.metric_meter()
    outcome = turn.outcome.value
    usage = turn.usage
    meter.create_counter(_names(TURNS.name), TURNS.description, TURNS.unit).add(
        1, _names.attributes({"agent.outcome": outcome, "gen_ai.agent.name": turn.agent})
    )
    named = _names.attributes({"gen_ai.agent.name": turn.agent})
    _histogram(meter, TURN_MODEL_CALLS).record(usage.model_calls, named)
    # A turn that continued as new returns its last run's steps: its rounds are
    # numbered on from the earlier runs', so the last number counts them all.
    last = turn.steps[-1].iteration if turn.steps else 0
    rounds = tool_rounds(turn.steps) if turn.runs == 1 else last
    _histogram(meter, TURN_STEPS).record(rounds, named)
    cost = cost_of(usage)
    if cost is not None:
        _float_histogram(meter, TURN_COST).record(cost, named)
    workflow.logger.info(
        "turn %s: %d model call(s), %d in / %d out tokens, cost %s",
        outcome,
        usage.model_calls,
        usage.input_tokens,
        usage.output_tokens,
        format_cost(cost),
    )


def count_fallback(agent: str, failed: str, then: str) -> None:
    """In workflow code: a model failed for good and the next gets the request. Nothing
    is recorded while the workflow replays."""
    attrs: dict[str, str | int] = {
        "gen_ai.agent.name": agent,
        "agent.model.failed": failed,
        "agent.model.next": then,
    }
    try:
        meter = workflow.metric_meter()
        counter = meter.create_counter(
            _names(FALLBACKS.name), FALLBACKS.description, FALLBACKS.unit
        )
        counter.add(1, _names.attributes(attrs))
    except Exception:
        # A metric must never fail a turn (see TurnMetrics).
        workflow.logger.exception("recording a model fallback failed")


class TurnMetrics(Interceptor):
    """Records every `AgentTurn` as it returns (`record_turn`), whatever ended it, so
    the loop's code carries no metrics of its own."""

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _TurnInbound


class _TurnInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        result = await super().execute_workflow(input)
        if isinstance(result, TurnOutput):
            try:
                record_turn(result)
            except Exception:
                # A metric must never fail a turn: its workflow task would be retried
                # until a fix is deployed, holding the customer's answer back.
                workflow.logger.exception("recording the turn's metrics failed")
        return result
