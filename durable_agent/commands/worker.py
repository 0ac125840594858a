"""Run a worker that serves agents' turns.

    python worker.py                               # the demo shop's agent; connects per
                                                   # TEMPORAL_* / temporal.toml, else to
                                                   # this folder's server, else starts it
    python worker.py --agent mypkg.agents:bookstore --agent mypkg.agents:helpdesk
    python worker.py --mcp-config mcp.json         # MCP servers' tools too (docs/mcp.md)
    python worker.py --metrics-port 9464 --log-format json --log-level info

`--agent MODULE:ATTRIBUTE` (repeatable; AGENT_AGENTS=a:b,c:d does the same) names an
`Agent` (or a function returning one) importable from the current directory or
PYTHONPATH; a turn that names no agent gets the first. Ctrl-C or SIGTERM stop it
gracefully: in-flight activities get time to finish, the last spans and metrics are
sent, and the server stops after the worker if this process started it (with a
warning when other programs' workers or running workflows still use it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import replace

from temporalio.client import Client

from durable_agent import mcp, telemetry
from durable_agent.agents import Agent
from durable_agent.budgets import Budgets
from durable_agent.errors import AgentDefinitionError, MemoryUnavailable
from durable_agent.mcp import MCPServer
from durable_agent.model import ModelCatalog
from durable_agent.plugin import AgentPlugin, AgentWorker
from durable_agent.plugin import build_worker as build_agent_worker
from durable_agent.runtime import logs, metrics, search, storage
from durable_agent.runtime.chaos import Faults
from durable_agent.runtime.cli import OneLineParser, task_queue_name
from durable_agent.runtime.deployments import VersionConflict
from durable_agent.runtime.server import ServerUnavailable, connect
from durable_agent.runtime.settings import worker_command
from durable_agent.serving import ServedAgent, load
from durable_agent.settings import Settings
from durable_agent.shields import ShieldConfigError

log = logging.getLogger("durable_agent.worker")

DEFAULT_AGENT = "durable_agent.shop.agent:agent"
"""What a worker serves when it is told no agent: the demo shop's support agent."""


def agents_of(specs: Sequence[str], flag: str = "--agent") -> list[Agent]:
    """The agents `specs` name (`module:attribute`); none: the demo shop's."""
    return load(specs or [DEFAULT_AGENT], flag=flag)


def build_worker(
    client: Client,
    task_queue: str | None = None,
    *,
    agents: Sequence[Agent] = (),
    settings: Settings | None = None,
    models: ModelCatalog | None = None,
    faults: Faults | None = None,
    budgets: Budgets | None = None,
    **options: object,
) -> AgentWorker:
    """A worker for `agents` (default: those the settings name, else the demo shop's)
    on `task_queue` (default: the settings')."""
    settings = settings or Settings.from_env()
    served = list(agents) or agents_of(settings.agents, "AGENT_AGENTS")
    return build_agent_worker(
        client,
        *served,
        task_queue=task_queue,
        settings=settings,
        models=models,
        faults=faults,
        budgets=budgets,
        **options,
    )


def describe(served: ServedAgent) -> str:
    """`bookstore: book_price, hold_book (writes, needs approval), …` for the start-up."""
    parts = []
    for name, t in served.tools.tools.items():
        notes = ["writes"] if t.side_effects else []
        if served.approvals.needs_approval(name, t.needs_approval):
            notes.append("needs approval")
        if t.agent is not None:
            notes.append(f"a sub-agent: {t.agent.agent or ', '.join(t.agent.tools)}")
        if not t.top_level:
            notes.append("for sub-agents only")
        parts.append(f"{name} ({', '.join(notes)})" if notes else name)
    return f"{served.name}: {', '.join(parts) or 'no tools'}"


async def run(
    agents: Sequence[Agent],
    settings: Settings,
    observed: metrics.MetricsSettings,
    servers: Sequence[MCPServer] = (),
) -> None:
    # MCP servers first: one that cannot start stops the worker before anything else.
    async with mcp.connected(agents, servers) as connected:
        await serve(connected, settings, observed)


async def serve(
    agents: Sequence[Agent], settings: Settings, observed: metrics.MetricsSettings
) -> None:
    # Core's log lines in the worker's format. The runtime's threads, which forward them,
    # end before the interpreter does (`runtime.runtimes`, at exit).
    runtime = metrics.worker_runtime(observed, core_logger=logging.getLogger("temporalio.core"))
    conn = await connect(start_embedded=True, runtime=runtime)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if problem := await search.ensure(conn.client):
            print(f"note: {problem}", flush=True)
        if conn.server and not os.environ.get("AGENT_PROMOTE"):
            # This process's own server: its one worker is the version that serves.
            settings = replace(settings, promote="always")
        worker = build_worker(conn.client, agents=agents, settings=settings)
        async with worker:
            print(
                f"worker ready on task queue {settings.task_queue!r} ({conn.where}); "
                "Ctrl-C to stop",
                flush=True,
            )
            for served in worker.plugin.agents.served.values():
                if served.agent in agents and served.name == served.agent.name:
                    print(f"agent {describe(served)}", flush=True)
            if worker.plugin.version is not None:
                version = worker.plugin.version
                print(f"version {version.deployment_name}:{version.build_id}", flush=True)
            if conn.workflows_url:
                print(f"Web UI: {conn.workflows_url}", flush=True)
            if observed.prometheus:
                print(f"metrics: http://{observed.prometheus}/metrics", flush=True)
            elif observed.otlp_url:
                print(f"metrics: OTLP to {observed.otlp_url}", flush=True)
            for note in conn.notes:
                print(f"note: {note}", flush=True)
            named = conn.server is None and conn.record is None
            for line in storage.storing_lines(
                conn.client.data_converter.external_storage, named_server=named
            ):
                print(line, flush=True)
            await stop.wait()
            print("shutting down…", flush=True)
        await metrics.drain(observed)
    finally:
        await conn.aclose([settings.task_queue])


def main() -> None:
    parser = OneLineParser(
        prog=worker_command(),
        description=__doc__.split("\n")[1].strip(),
        epilog=(
            "settings (environment): TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / TEMPORAL_API_KEY / "
            "TEMPORAL_PROFILE (the server; unset: this folder's own, started if need be), "
            "AGENT_AGENTS, AGENT_MODEL (default model spec), OPENAI_BASE_URL / OPENAI_API_KEY, "
            "ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL, "
            "AWS_*, AGENT_APPROVAL_REQUIRED / AGENT_APPROVAL_WAIVED, AGENT_SHIELDS_*, "
            "AGENT_ENCRYPTION_KEY, AGENT_SHOP_DB / AGENT_SHOP_STORE, AGENT_MODEL_PRICES, "
            "OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER; see README.md"
        ),
    )
    parser.add_argument(
        "--agent",
        action="append",
        metavar="MODULE:ATTRIBUTE",
        help="an agent to serve (repeatable; default: from AGENT_AGENTS, else the demo "
        f"shop's, {DEFAULT_AGENT})",
    )
    parser.add_argument(
        "--mcp-config",
        metavar="FILE",
        help='MCP servers whose tools every agent served also offers: {"mcpServers": '
        '{"NAME": {"command": ..., "args": [...]} or {"url": ...}}} (docs/mcp.md)',
    )
    parser.add_argument(
        "--task-queue",
        type=task_queue_name,
        help="task queue to serve; clients must use the same (default: from "
        "AGENT_TASK_QUEUE, else agent-turns)",
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
        settings = Settings.from_env()
        if args.task_queue:
            settings = replace(settings, task_queue=args.task_queue)
        flag = "--agent" if args.agent else "AGENT_AGENTS"
        agents = agents_of(args.agent or settings.agents, flag)
        servers = mcp.load_config(args.mcp_config) if args.mcp_config else []
        # Every definition is checked before anything connects: a bad one is one line.
        # The approval settings' names of MCP tools are checked once the servers list them.
        prefixes = [s.tool_prefix for s in [*servers, *(s for a in agents for s in a.mcp_servers)]]
        before = replace(settings, approvals=settings.approvals.outside(prefixes))
        AgentPlugin(*(replace(a, mcp_servers=()) for a in agents), settings=before)
        observed = metrics.MetricsSettings.from_env(args.metrics_port)
        asyncio.run(run(agents, settings, observed, servers))
    except (
        ServerUnavailable,
        ShieldConfigError,
        AgentDefinitionError,
        MemoryUnavailable,
        VersionConflict,
        ValueError,
    ) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        # Ctrl-C before the worker was ready (connecting, starting the server): it was
        # asked to stop, and stops, without a traceback.
        raise SystemExit(130) from None
    finally:
        telemetry.flush()


if __name__ == "__main__":
    main()
