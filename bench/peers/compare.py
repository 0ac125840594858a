"""The comparison run: the agent, the floor and each peer doing one-tool turns.

All on one server in one run, each system's turns in its own worker process, and
interleaved round by round (latency: one turn of each system per round; throughput:
each system in turn, the order rotated every round) so that all of them see the same
noise. Ratios are this project / peer: below 1 is faster for latency, above 1 is
more turns per second for throughput.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from temporalio.client import Client

from durable_agent.bench import QUESTION
from durable_agent.bench.floor import FloorInput, FloorTurn
from durable_agent.bench.measure import batches, pct, spawn, stop
from durable_agent.bench.models import TASKS
from durable_agent.bench.peers import PEERS, Peer, PeerTurnInput, PeerTurnOutput, versions
from durable_agent.runtime.turns import start_turn
from durable_agent.types import TurnInput

TARGETS = {
    "latency_ratio": 0.85,
    "throughput_ratio": 1.2,
    "cpu_ratio": 0.85,
    "history_events_ratio": 1.0,
    "history_bytes_ratio": 1.0,
}
"""The agent against each peer (this project / peer): latency at most 0.85×, turns
per second at least 1.2×, worker + server CPU per turn at most 0.85×, and no more
history events or bytes per turn than the peer."""
AT_MOST = ("latency_ratio", "cpu_ratio", "history_events_ratio", "history_bytes_ratio")
ONE_TOOL = "one tool"
CONCURRENCIES = (50, 200)
THROUGHPUT_ROUNDS = 5
"""Each system runs this many batches per concurrency, between the others' batches;
its figures are their medians."""
WARM_UP_ROUNDS = 5
ANSWER = "Herbal Handsoap"
"""The item of order 123456: every system's one-tool answer must name it."""


async def compare(
    agent: AgentSystem,
    floor: FloorSystem,
    address: str,
    server_pid: int,
    db: Path,
    turns: int,
    concurrencies: tuple[int, ...] = CONCURRENCIES,
    rounds: int = THROUGHPUT_ROUNDS,
) -> dict[str, Any]:
    """Start each peer's worker, compare them with the agent and the floor, stop them:
    every system's figures (`one_tool_turn`) and each peer's ratios (`peers`)."""
    # A plain client: the peers' workflows take and return dataclasses, which every
    # data converter encodes alike (the agent's may also encrypt).
    client = await Client.connect(address)
    systems: list[System] = [agent, floor]
    workers = []
    try:
        for peer in PEERS:
            queue = f"bench-{peer.name}-{uuid.uuid4().hex[:6]}"
            workers.append(
                spawn("durable_agent.bench.peers.worker", peer.name, address, queue, str(db))
            )
            systems.append(PeerSystem(client, queue, workers[-1].pid, peer))
        figures = await Comparison(client, systems, server_pid).run(turns, concurrencies, rounds)
    finally:
        for worker in workers:
            stop(worker)
    installed = versions()
    return {
        "one_tool_turn": figures,
        "peers": {p.name: ratios(figures, p.name, installed[p.name]) for p in PEERS},
    }


def ratios(
    figures: dict[str, dict[str, Any]], peer: str, versions: dict[str, str]
) -> dict[str, Any]:
    """The agent against one peer (this project / peer)."""
    agent, other = figures["agent"], figures[peer]
    return {
        "versions": versions,
        "latency_ratio": round(agent["latency_ms"]["median"] / other["latency_ms"]["median"], 3),
        "throughput_ratio": round(
            min(agent["turns_per_s"][c] / other["turns_per_s"][c] for c in agent["turns_per_s"]),
            3,
        ),
        "cpu_ratio": round(_cpu(agent) / _cpu(other), 3),
        "history_events_ratio": round(agent["history_events"] / other["history_events"], 3),
        "history_bytes_ratio": round(agent["history_bytes"] / other["history_bytes"], 3),
        "model_calls_ratio": {
            t: round(n / other["model_calls"][t], 3) for t, n in agent["model_calls"].items()
        },
    }


def _cpu(figures: dict[str, Any]) -> float:
    """Worker + server CPU per turn at the highest concurrency."""
    top = figures["cpu_ms_per_turn"][list(figures["cpu_ms_per_turn"])[-1]]
    return float(top["worker"] + top["server"])


def report(r: dict[str, Any]) -> str:
    """Every system's one-tool turn side by side, then the agent's ratios per peer."""
    figures = r["one_tool_turn"]
    names = list(figures)
    top = list(figures["agent"]["turns_per_s"])[-1]  # the highest concurrency
    rows: list[tuple[str, list[Any]]] = [
        (
            "one-tool turn latency, median (ms)",
            [f["latency_ms"]["median"] for f in figures.values()],
        ),
        ("one-tool turn latency, p95 (ms)", [f["latency_ms"]["p95"] for f in figures.values()]),
        *[
            (f"turns/s at {c} concurrent", [f["turns_per_s"][c] for f in figures.values()])
            for c in figures["agent"]["turns_per_s"]
        ],
        *[
            (
                f"{proc} CPU per turn at {top} (ms)",
                [f["cpu_ms_per_turn"][top][proc] for f in figures.values()],
            )
            for proc in ("worker", "server")
        ],
        ("history events per turn", [f["history_events"] for f in figures.values()]),
        ("history bytes per turn", [f["history_bytes"] for f in figures.values()]),
        *[
            (f"model calls: {task}", [_or_dash(f["model_calls"][task]) for f in figures.values()])
            for task in TASKS
        ],
    ]
    lines = [f"{'':40}" + "".join(f"{n:>15}" for n in names)]
    lines += [f"{label:40}" + "".join(f"{v:>15}" for v in values) for label, values in rows]
    lines.append("")
    for name, peer in r["peers"].items():
        versions = ", ".join(f"{d} {v}" for d, v in peer["versions"].items())
        lines.append(f"agent / {name} ({versions})")
        for key in TARGETS:
            lines.append(f"  {key:38} {peer[key]:>10}   target {_target(key)}")
        calls = ", ".join(f"{t}: {v}" for t, v in peer["model_calls_ratio"].items())
        lines.append(f"  {'model calls ratio':38} {calls}")
    return "\n".join(lines)


def _or_dash(value: int | None) -> int | str:
    return "—" if value is None else value


def _target(key: str) -> str:
    return f"{'<=' if key in AT_MOST else '>='} {TARGETS[key]}"


class Comparison:
    def __init__(self, client: Client, systems: list[System], server_pid: int) -> None:
        self.client = client
        """Any client: it only reads histories."""
        self.systems = systems
        self.server_pid = server_pid

    async def run(self, turns: int, concurrencies: tuple[int, ...], rounds: int) -> dict[str, Any]:
        """Every figure of every system: latency, throughput and CPU, history, model calls."""
        await self.latencies(WARM_UP_ROUNDS)  # imports, caches, connections
        latency = await self.latencies(turns)
        figures: dict[str, dict[str, Any]] = {
            s.name: {"latency_ms": _ms(latency[s.name]), "turns_per_s": {}, "cpu_ms_per_turn": {}}
            for s in self.systems
        }
        for c in concurrencies:
            rates, cpu = await self.throughput(c, rounds)
            for name, rate in rates.items():
                figures[name]["turns_per_s"][str(c)] = round(rate, 2)
                figures[name]["cpu_ms_per_turn"][str(c)] = cpu[name]
        for s in self.systems:
            figures[s.name].update(await self.history(await s.turn()))
            figures[s.name]["model_calls"] = {t: await s.model_calls(t) for t in TASKS}
        return figures

    async def latencies(self, turns: int) -> dict[str, list[float]]:
        """Seconds per sequential turn, one turn of each system per round."""
        out: dict[str, list[float]] = defaultdict(list)
        for _ in range(turns):
            for s in self.systems:
                t0 = time.perf_counter()
                await s.turn()
                out[s.name].append(time.perf_counter() - t0)
        return out

    async def throughput(
        self, concurrency: int, rounds: int
    ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """Turns per second with `concurrency` turns at once, and the CPU a turn costs
        its worker and the server: medians over `rounds` batches (`bench.measure.batches`)."""
        return await batches(
            {
                s.name: (s.turn, {"worker": s.worker_pid, "server": self.server_pid})
                for s in self.systems
            },
            concurrency,
            rounds,
        )

    async def history(self, workflow_id: str) -> dict[str, int]:
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        return {
            "history_events": len(history.events),
            "history_bytes": sum(e.ByteSize() for e in history.events),
        }


def _ms(seconds: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(seconds) * 1000, 2),
        "p95": round(pct(seconds, 0.95) * 1000, 2),
    }


class System(Protocol):
    """What the comparison runs: the agent, the floor, or a peer."""

    @property
    def name(self) -> str: ...

    @property
    def worker_pid(self) -> int:
        """The process that runs its turns, whose CPU a turn is charged."""
        ...

    async def turn(self) -> str:
        """Run one one-tool turn to its end; its workflow id."""
        ...

    async def model_calls(self, task: str) -> int | None:
        """Run one turn of `task`; how many model calls it made (None: it has no model)."""
        ...


@dataclass
class AgentSystem:
    """This project's turn, with the scripted model of `bench.models.TaskModel`."""

    client: Client
    task_queue: str
    worker_pid: int
    name: str = "agent"

    async def turn(self) -> str:
        return (await self._run(ONE_TOOL))[0]

    async def model_calls(self, task: str) -> int | None:
        return (await self._run(task))[1]

    async def _run(self, task: str) -> tuple[str, int]:
        turn = TurnInput(question=QUESTION, model=f"task:{task}")
        handle = await start_turn(self.client, turn, self.task_queue)
        result = await handle.result()
        if task == ONE_TOOL:
            assert ANSWER in result.answer, result.answer
        return handle.id, result.usage.model_calls


@dataclass
class FloorSystem:
    """Temporal's floor (`bench.floor`) with one iteration: a one-tool turn's shape."""

    client: Client
    task_queue: str
    worker_pid: int
    name: str = "floor"

    async def turn(self) -> str:
        handle = await self.client.start_workflow(
            FloorTurn.run,
            FloorInput(iterations=1),
            id=f"floor-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
        )
        await handle.result()
        return handle.id

    async def model_calls(self, task: str) -> int | None:
        return None


@dataclass
class PeerSystem:
    """A peer's workflow, started by type name: its code lives in its own worker.
    Its model calls are the model activities in the turn's history."""

    client: Client
    task_queue: str
    worker_pid: int
    peer: Peer

    @property
    def name(self) -> str:
        return self.peer.name

    async def turn(self) -> str:
        return await self._run(ONE_TOOL)

    async def model_calls(self, task: str) -> int | None:
        workflow_id = await self._run(task)
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        return sum(self.peer.model_activity in kind for kind in scheduled)

    async def _run(self, task: str) -> str:
        handle = await self.client.start_workflow(
            self.peer.workflow,
            PeerTurnInput(question=QUESTION, task=task),
            id=f"{self.peer.name}-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
            result_type=PeerTurnOutput,
        )
        result = await handle.result()
        if task == ONE_TOOL:
            assert ANSWER in result.answer, result.answer
        return handle.id
