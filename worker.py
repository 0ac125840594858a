"""Run a worker for agent turns.

    python worker.py                 # connects per TEMPORAL_* / temporal.toml, else
                                     # to localhost:7233, else starts an embedded server
    python worker.py --metrics-port 9464 --log-format json --log-level info

Ctrl-C or SIGTERM stop it gracefully: in-flight activities get time to finish,
the last spans and metrics are sent, and the server stops after the worker if
this process started it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities import turn_activities
from durable_agent import telemetry
from durable_agent.approval import ApprovalPolicy
from durable_agent.model import Model, ModelCatalog
from durable_agent.offline import OfflineModel
from durable_agent.runtime import logs, metrics, search
from durable_agent.runtime.chaos import ChaosInterceptor, Faults
from durable_agent.runtime.server import ServerUnavailable, connect
from durable_agent.runtime.settings import DEFAULT_MODEL, TASK_QUEUE
from durable_agent.shields import ShieldConfigError, ShieldSet
from durable_agent.tools import ToolRegistry
from shop import open_store, shop_tools
from workflows import AgentTurn, Conversation

log = logging.getLogger("durable_agent.worker")


MAX_WORKFLOW_TASKS = 10
"""Workflow tasks a worker runs at once (one Python process runs one at a time)."""


def default_models() -> ModelCatalog:
    """`offline`, `openai:<model>` (any OpenAI-compatible server), `bedrock:<model-id>`,
    `sagemaker:<endpoint>`. Backends are built on first use, per worker; turns that
    name no model get `AGENT_MODEL` (default `offline`)."""

    def openai_chat(model: str) -> Model:
        from durable_agent.backends.openai_chat import OpenAIChatModel

        return OpenAIChatModel(model)

    def bedrock(model_id: str) -> Model:
        from durable_agent.backends.bedrock import BedrockConverseModel

        return BedrockConverseModel(model_id)

    def sagemaker(endpoint: str) -> Model:
        from durable_agent.backends.sagemaker import SageMakerTextModel

        return SageMakerTextModel(endpoint)

    return ModelCatalog(
        {
            "offline": lambda _arg: OfflineModel(),
            "openai": openai_chat,
            "bedrock": bedrock,
            "sagemaker": sagemaker,
        },
        default=DEFAULT_MODEL,
    )


def build_worker(
    client: Client,
    task_queue: str = TASK_QUEUE,
    *,
    models: ModelCatalog | None = None,
    tools: ToolRegistry | None = None,
    deps: Any = None,
    approvals: ApprovalPolicy | None = None,
    shields: ShieldSet | None = None,
    faults: Faults | None = None,
    **options: Any,
) -> Worker:
    """A worker for turns and conversations and their activities. Defaults: `tools`,
    the demo shop's (`AGENT_POLICY_EXPERT`); `deps` (what tools get as `ctx.deps`),
    the shop's store (`AGENT_SHOP_STORE`); `approvals`, `AGENT_APPROVAL_*`; `shields`,
    `AGENT_SHIELDS_*`; `faults` (chaos runs), `AGENT_FAULTS`. `options` go to `Worker`."""
    settings: dict[str, Any] = {
        "task_queue": task_queue,
        "workflows": [AgentTurn, Conversation],
        # A dead worker's cached workflows move to a live one after 2 s, not 10 s.
        "sticky_queue_schedule_to_start_timeout": timedelta(seconds=2),
        # Workflow tasks take CPU, not I/O: a worker takes only as many at once as it
        # gets through well within their timeout (workflows/policies.py); the rest
        # wait on the server, where their clock has not started.
        "max_concurrent_workflow_tasks": MAX_WORKFLOW_TASKS,
        # On SIGTERM, let in-flight activities finish rather than time out.
        "graceful_shutdown_timeout": timedelta(seconds=10),
        **options,
    }
    if "activities" not in settings:
        tools = tools if tools is not None else shop_tools()
        approvals = approvals if approvals is not None else ApprovalPolicy.from_env()
        approvals.check(tools.tools)
        settings["activities"] = turn_activities(
            models or default_models(),
            tools,
            deps if deps is not None else open_store(),
            approvals,
            shields if shields is not None else ShieldSet.from_env(),
        )
    # Inside the tracing plugin's spans (the client's interceptors come first): each
    # activity attempt's span gets its attempt and error, each turn its metrics.
    observe = [telemetry.ActivityAttempts(), metrics.TurnMetrics()]
    settings["interceptors"] = [*observe, *settings.get("interceptors", [])]
    faults = faults if faults is not None else Faults.from_env()
    if faults.active:
        settings["interceptors"] = [*settings["interceptors"], ChaosInterceptor(faults)]
    return Worker(client, **settings)


def describe_tools(tools: ToolRegistry, approvals: ApprovalPolicy) -> str:
    """`order_status, start_return (writes, needs approval), …` for the start-up line."""
    parts = []
    for name, t in tools.tools.items():
        notes = ["writes"] if t.side_effects else []
        if approvals.needs_approval(name, t.needs_approval):
            notes.append("needs approval")
        if t.agent is not None:
            notes.append(f"a sub-agent with {', '.join(t.agent.tools)}")
        if not t.top_level:
            notes.append("for sub-agents only")
        parts.append(f"{name} ({', '.join(notes)})" if notes else name)
    return ", ".join(parts)


async def run(task_queue: str, observed: metrics.MetricsSettings) -> None:
    runtime = metrics.worker_runtime(observed, core_logger=logging.getLogger("temporalio.core"))
    conn = await connect(start_embedded=True, runtime=runtime)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if problem := await search.ensure(conn.client):
            print(f"note: {problem}", flush=True)
        async with build_worker(conn.client, task_queue):
            where = (
                "embedded server" if conn.server else conn.client.service_client.config.target_host
            )
            print(
                f"worker ready on task queue {task_queue!r} ({where}); Ctrl-C to stop", flush=True
            )
            print(f"tools: {describe_tools(shop_tools(), ApprovalPolicy.from_env())}", flush=True)
            if conn.workflows_url:
                print(f"Web UI: {conn.workflows_url}", flush=True)
            if observed.prometheus:
                print(f"metrics: http://{observed.prometheus}/metrics", flush=True)
            elif observed.otlp_url:
                print(f"metrics: OTLP to {observed.otlp_url}", flush=True)
            await stop.wait()
            print("shutting down…", flush=True)
        await metrics.drain(observed)
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[1].strip(),
        epilog=(
            "settings (environment): TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / TEMPORAL_API_KEY / "
            "TEMPORAL_PROFILE (the server; unset: localhost:7233 or an embedded one), "
            "AGENT_MODEL (default model spec), OPENAI_BASE_URL / OPENAI_API_KEY, AWS_*, "
            "AGENT_APPROVAL_REQUIRED / AGENT_APPROVAL_WAIVED, AGENT_ENCRYPTION_KEY, "
            "AGENT_SHOP_DB / AGENT_SHOP_STORE, AGENT_MODEL_PRICES, OTEL_TRACES_EXPORTER, "
            "OTEL_METRICS_EXPORTER; see README.md"
        ),
    )
    parser.add_argument(
        "--task-queue",
        default=TASK_QUEUE,
        help="task queue to serve; clients must use the same (default: %(default)s, "
        "from AGENT_TASK_QUEUE)",
    )
    parser.add_argument(
        "--metrics-port",
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics (Temporal's and the agent's) on "
        f"http://HOST:PORT/metrics, host {metrics.DEFAULT_HOST} unless given "
        f"(default: from {metrics.PORT_SETTING}; none)",
    )
    parser.add_argument(
        "--log-format",
        choices=logs.FORMATS,
        help=f"text for people, json for log shippers (default: from {logs.FORMAT_SETTING}; text)",
    )
    parser.add_argument(
        "--log-level",
        choices=logs.LEVELS,
        help="info logs every model and tool call with its turn and trace "
        f"(default: from {logs.LEVEL_SETTING}; warning)",
    )
    args = parser.parse_args()
    try:
        logs.setup(args.log_format, args.log_level)
        observed = metrics.MetricsSettings.from_env(args.metrics_port)
        asyncio.run(run(args.task_queue, observed))
    except (ServerUnavailable, ShieldConfigError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    finally:
        telemetry.flush()


if __name__ == "__main__":
    main()
