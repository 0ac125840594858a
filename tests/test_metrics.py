"""Metrics from one endpoint: a real `worker.py --metrics-port` scraped after a turn
holds Temporal's own series and the agent's, equal to the turn's usage; with
OTEL_METRICS_EXPORTER=otlp the same set reaches an OTLP receiver, under the GenAI
conventions' dotted names."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.runtime.metrics import MetricsConfigError, MetricsSettings, worker_runtime
from durable_agent.runtime.server import free_port
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput, TurnOutput
from tests.fakes.otlp import OtlpReceiver, attributes

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Has order 123456 shipped?"

# -- settings ---------------------------------------------------------------------------


def test_a_port_alone_serves_prometheus_on_loopback() -> None:
    assert MetricsSettings.from_env("9464", {}).prometheus == "127.0.0.1:9464"
    assert MetricsSettings.from_env(None, {"AGENT_METRICS_PORT": "0.0.0.0:9100"}).prometheus == (
        "0.0.0.0:9100"
    )
    assert not MetricsSettings.from_env(None, {}).active
    prometheus = {"OTEL_METRICS_EXPORTER": "prometheus"}
    assert MetricsSettings.from_env(None, prometheus).prometheus == "localhost:9464"


def test_otlp_follows_the_standard_variables() -> None:
    http = MetricsSettings.from_env(
        None,
        {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-team=agents",
            "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        },
    )
    assert (http.otlp_url, http.otlp_http) == ("http://collector:4318/v1/metrics", True)
    assert http.otlp_headers == {"authorization": "Bearer abc", "x-team": "agents"}
    assert http.otlp_interval == timedelta(seconds=5)
    grpc = MetricsSettings.from_env(
        None, {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}
    )
    assert (grpc.otlp_url, grpc.otlp_http) == ("http://localhost:4317", False)
    own = MetricsSettings.from_env(
        None,
        {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/x"},
    )
    assert own.otlp_url == "http://m/x"


@pytest.mark.parametrize(
    "port, env, message",
    [
        ("9464", {"OTEL_METRICS_EXPORTER": "otlp"}, "use one of them"),
        (None, {"OTEL_METRICS_EXPORTER": "statsd"}, "use none, prometheus or otlp"),
        ("metrics", {}, "give PORT or HOST:PORT"),
        ("70000", {}, "give PORT or HOST:PORT"),
        (
            None,
            {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "grpc",
        ),
    ],
)
def test_contradicting_or_unreadable_settings_are_named(
    port: str | None, env: dict[str, str], message: str
) -> None:
    with pytest.raises(MetricsConfigError, match=re.escape(message)):
        MetricsSettings.from_env(port, env)


def test_a_taken_port_is_named_with_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(MetricsConfigError, match=f"{address}.*choose another --metrics-port"):
            worker_runtime(MetricsSettings(prometheus=address))


# -- a real worker --------------------------------------------------------------------


@pytest.fixture
def worker_env(env: WorkflowEnvironment, tmp_path: Path) -> dict[str, str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    return base | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_TASK_QUEUE": f"metrics-{uuid.uuid4().hex[:8]}",
        "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONUNBUFFERED": "1",
    }


@contextmanager
def run_worker(env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """`worker.py` until the block ends, then SIGTERM: it must exit cleanly."""
    proc = subprocess.Popen(
        [sys.executable, "worker.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "worker ready" in line, line + (proc.stderr.read() if proc.stderr else "")
        yield proc
        proc.terminate()
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def one_turn(env: WorkflowEnvironment, task_queue: str) -> TurnOutput:
    handle = await start_turn(env.client, TurnInput(question=QUESTION), task_queue)
    result: TurnOutput = await handle.result()
    assert result.outcome is Outcome.ANSWERED
    return result


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_prometheus(text: str) -> Series:
    series: Series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        assert match, f"not Prometheus text: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        series[(match.group(1), labels)] = float(match.group(3))
    return series


def total(series: Series, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and wanted <= ls)


def scrape(port: int) -> Series:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse_prometheus(r.read().decode())


def until_holds(check: Callable[[], None], timeout: float = 30) -> None:
    """Run `check` until it passes: a worker records some series after the client has
    the turn's result (Temporal's own when its workflow task completes), so each read
    is only what the worker has recorded so far. Past `timeout`, its failure stands."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


async def test_the_workers_endpoint_holds_temporals_and_the_agents_metrics(
    env: WorkflowEnvironment, worker_env: dict[str, str]
) -> None:
    port = free_port()
    with run_worker(worker_env, "--metrics-port", str(port)):
        result = await one_turn(env, worker_env["AGENT_TASK_QUEUE"])
        usage = result.usage

        def every_series_is_there() -> None:
            series = scrape(port)
            names = {name for name, _ in series}
            # Temporal's own, as its SDK names them.
            for name in (
                "temporal_workflow_completed",
                "temporal_activity_execution_latency_count",
            ):
                assert name in names, sorted(n for n in names if n.startswith("temporal_"))
            assert total(series, "temporal_workflow_completed", workflow_type="AgentTurn") == 1
            # The agent's, equal to what the turn reports.
            tokens = "gen_ai_client_token_usage_sum"
            assert total(series, tokens, gen_ai_token_type="input") == usage.input_tokens
            assert total(series, tokens, gen_ai_token_type="output") == usage.output_tokens
            assert total(series, tokens, gen_ai_provider_name="offline") == usage.total_tokens
            assert total(series, "gen_ai_client_operation_duration_count") == usage.model_calls
            assert total(series, "agent_turns", agent_outcome="answered") == 1
            assert total(series, "agent_turns") == 1
            assert total(series, "agent_turn_model_calls_sum") == usage.model_calls
            assert total(series, "agent_turn_steps_sum") == 1
            assert (
                total(
                    series,
                    "agent_tool_calls",
                    gen_ai_tool_name="order_status",
                    agent_tool_result="ok",
                )
                == 1
            )
            assert total(series, "agent_turn_cost_usd_count") == 1  # the offline model's $0
            assert total(series, "agent_turn_cost_usd_sum") == usage.cost_usd == 0

        await asyncio.to_thread(until_holds, every_series_is_there)


async def test_otlp_gets_the_same_set_under_the_conventions_names(
    env: WorkflowEnvironment, worker_env: dict[str, str]
) -> None:
    with OtlpReceiver() as otlp:
        otlp_env = worker_env | {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_SERVICE_NAME": "agent-worker",
        }
        with run_worker(otlp_env):
            result = await one_turn(env, worker_env["AGENT_TASK_QUEUE"])

            def every_series_is_there() -> None:
                points = otlp.metric_points()
                assert "temporal_workflow_completed" in points, sorted(points)
                assert "gen_ai_client_token_usage" not in points  # dots, as conventions spell

                def latest_sum(name: str, **labels: str) -> float:
                    # Cumulative: each export repeats the totals, so the last per series counts.
                    last: dict[frozenset[tuple[str, str]], float] = {}
                    for attrs, point in points.get(name, []):
                        key = frozenset((k, str(v)) for k, v in attrs.items())
                        if set(labels.items()) <= key:
                            histogram = point.DESCRIPTOR.name == "HistogramDataPoint"
                            last[key] = (
                                point.sum
                                if histogram
                                else getattr(point, point.WhichOneof("value"))
                            )
                    return sum(last.values())

                tokens = "gen_ai.client.token.usage"
                usage = result.usage
                assert latest_sum(tokens, **{"gen_ai.token.type": "input"}) == usage.input_tokens
                assert latest_sum(tokens, **{"gen_ai.token.type": "output"}) == usage.output_tokens
                assert latest_sum("agent.turns", **{"agent.outcome": "answered"}) == 1

            await asyncio.to_thread(until_holds, every_series_is_there)
        resource = otlp.metrics[-1].resource_metrics[0].resource

    assert attributes(resource.attributes)["service.name"] == "agent-worker"
