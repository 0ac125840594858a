"""Run a worker for agent turns.

    python worker.py                 # connects per TEMPORAL_* / temporal.toml, else
                                     # to localhost:7233, else starts an embedded server

Ctrl-C or SIGTERM stop it gracefully: in-flight activities get time to finish,
and the server stops after the worker if this process started it.
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
from agent.approval import ApprovalPolicy
from agent.model import Model, ModelCatalog
from agent.offline import OfflineModel
from agent.tools import ToolRegistry
from runtime import search
from runtime.chaos import ChaosInterceptor, Faults
from runtime.server import ServerUnavailable, connect
from runtime.settings import DEFAULT_MODEL, TASK_QUEUE
from shop import TOOLS, open_store
from workflows import AgentTurn, Conversation

log = logging.getLogger("durable_agent.worker")


def default_models() -> ModelCatalog:
    """`offline`, `openai:<model>` (any OpenAI-compatible server), `bedrock:<model-id>`,
    `sagemaker:<endpoint>`. Backends are built on first use, per worker; turns that
    name no model get `AGENT_MODEL` (default `offline`)."""

    def openai_chat(model: str) -> Model:
        from agent.backends.openai_chat import OpenAIChatModel

        return OpenAIChatModel(model)

    def bedrock(model_id: str) -> Model:
        from agent.backends.bedrock import BedrockConverseModel

        return BedrockConverseModel(model_id)

    def sagemaker(endpoint: str) -> Model:
        from agent.backends.sagemaker import SageMakerTextModel

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
    tools: ToolRegistry = TOOLS,
    deps: Any = None,
    approvals: ApprovalPolicy | None = None,
    faults: Faults | None = None,
    **options: Any,
) -> Worker:
    """A worker for turns and conversations and their activities. `deps` is what
    tools get as `ctx.deps` (by default the demo shop's store, per
    `AGENT_SHOP_STORE`); `approvals` default to `AGENT_APPROVAL_*`; `faults`
    (chaos runs) to `AGENT_FAULTS`; `options` go to `Worker`."""
    settings: dict[str, Any] = {
        "task_queue": task_queue,
        "workflows": [AgentTurn, Conversation],
        # A dead worker's cached workflows move to a live one after 2 s, not 10 s.
        "sticky_queue_schedule_to_start_timeout": timedelta(seconds=2),
        # On SIGTERM, let in-flight activities finish rather than time out.
        "graceful_shutdown_timeout": timedelta(seconds=10),
        **options,
    }
    if "activities" not in settings:
        approvals = approvals if approvals is not None else ApprovalPolicy.from_env()
        approvals.check(tools.tools)
        settings["activities"] = turn_activities(
            models or default_models(),
            tools,
            deps if deps is not None else open_store(),
            approvals,
        )
    faults = faults if faults is not None else Faults.from_env()
    if faults.active:
        settings["interceptors"] = [*settings.get("interceptors", []), ChaosInterceptor(faults)]
    return Worker(client, **settings)


def describe_tools(tools: ToolRegistry, approvals: ApprovalPolicy) -> str:
    """`order_status, start_return (writes, needs approval), …` for the start-up line."""
    parts = []
    for name, t in tools.tools.items():
        notes = ["writes"] if t.side_effects else []
        if approvals.needs_approval(name, t.needs_approval):
            notes.append("needs approval")
        parts.append(f"{name} ({', '.join(notes)})" if notes else name)
    return ", ".join(parts)


async def run(task_queue: str) -> None:
    conn = await connect(start_embedded=True)
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
            print(f"tools: {describe_tools(TOOLS, ApprovalPolicy.from_env())}", flush=True)
            if conn.workflows_url:
                print(f"Web UI: {conn.workflows_url}", flush=True)
            await stop.wait()
            print("shutting down…", flush=True)
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
            "AGENT_SHOP_DB / AGENT_SHOP_STORE, OTEL_TRACES_EXPORTER; see README.md"
        ),
    )
    parser.add_argument(
        "--task-queue",
        default=TASK_QUEUE,
        help="task queue to serve; clients must use the same (default: %(default)s, "
        "from AGENT_TASK_QUEUE)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run(args.task_queue))
    except (ServerUnavailable, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
