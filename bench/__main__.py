"""Benchmark: agent turns against Temporal's own floor, in one run on one server.

    python -m durable_agent.bench [--turns 40] [--iterations 3] [--out bench-results.json]
                    [--peers] [--memory]
    python -m durable_agent.bench --long [--steps 1000] [--doc-kb 20] [--kill-every 30]
                    [--kill-at-writes] ...

Starts its own dev server (SQLite file, the worker's tuning) and a worker
process hosting both the agent turn (offline model, demo tools) and the floor
(a no-op workflow with the same activity shape per iteration). `--peers` adds
other durable agents doing the same one-tool turn (`bench.peers`; the `peers`
extra installs them), `--memory` a worker's memory over 1,000 turns
(`bench.memory`). `--long` runs one turn of 1,000 steps over whole documents
instead, on this project, in a plain loop and on the peers (`bench.long`). Figures
from one run are comparable with each other, not across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from durable_agent import telemetry
from durable_agent.bench import QUESTION, peers
from durable_agent.bench.floor import FloorInput, FloorTurn
from durable_agent.bench.kills import kill_one_of_two
from durable_agent.bench.measure import batches, memory_mb, pct, spawn_worker, stop
from durable_agent.bench.memory import rss_over_turns, start_middle_end
from durable_agent.bench.models import EXPECTED_MODEL_CALLS, TASK_QUESTION, TASKS
from durable_agent.bench.peers import compare as peer_comparison
from durable_agent.bench.worker import MODEL_CALLS_SETTING
from durable_agent.runtime.server import EmbeddedServer, free_port, open_client
from durable_agent.runtime.turns import follow, start_turn
from durable_agent.shields import SETTINGS as SHIELD_SETTINGS
from durable_agent.stream import TokensEvent
from durable_agent.types import TurnInput

TARGETS = {"latency_ratio": 1.05, "throughput_ratio": 0.85, "recovery_s": 3.0}
MAX_EVENTS_PER_ITERATION = 25
MEMORY_TURNS = 1000
MEMORY_SAMPLE_EVERY = 100
MEMORY_CONCURRENCY = 20
THROUGHPUT_ROUNDS = 3
"""Batches of agent and floor turns per concurrency; the figures are their medians (a
batch now and then takes twice as long, whichever system runs it)."""


class Bench:
    def __init__(
        self, client: Client, task_queue: str, iterations: int, worker_pid: int, server_pid: int
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.iterations = iterations
        self.pids = {"worker": worker_pid, "server": server_pid}
        self.cpu_ms_per_turn: dict[str, dict[str, float]] = {"agent": {}, "floor": {}}

    async def agent(self, iterations: int | None = None, task_queue: str | None = None) -> str:
        n = iterations or self.iterations
        turn = TurnInput(question=QUESTION, model=f"repeat:{n}" if n > 1 else "offline")
        handle = await start_turn(self.client, turn, task_queue or self.task_queue)
        result = await handle.result()
        assert "Herbal Handsoap" in result.answer, result.answer
        return handle.id

    async def floor(self, iterations: int | None = None) -> str:
        handle = await self.client.start_workflow(
            FloorTurn.run,
            FloorInput(iterations=iterations or self.iterations),
            id=f"floor-{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
        )
        await handle.result()
        return handle.id

    async def latencies(self, turns: int) -> dict[str, list[float]]:
        """Sequential turns, agent and floor interleaved so both see the same noise."""
        out: dict[str, list[float]] = {"agent": [], "floor": []}
        for _ in range(turns):
            for name, run in (("agent", self.agent), ("floor", self.floor)):
                t0 = time.perf_counter()
                await run()
                out[name].append((time.perf_counter() - t0) / self.iterations)
        return out

    async def throughput(self, concurrency: int) -> dict[str, float]:
        """Turns per second with `concurrency` at once, and CPU per turn: the medians
        over `THROUGHPUT_ROUNDS` batches of each, agent and floor taking turns."""
        rates, cpu = await batches(
            {
                "floor": (lambda: self.floor(1), self.pids),
                "agent": (lambda: self.agent(1), self.pids),
            },
            concurrency,
            THROUGHPUT_ROUNDS,
        )
        self.cpu_ms_per_turn.update(cpu)
        return rates

    async def model_calls(self) -> dict[str, int]:
        """Model calls each task of `bench.models.TASKS` costs (what users pay for)."""
        out = {}
        for task in TASKS:
            turn = TurnInput(question=TASK_QUESTION, model=f"task:{task}")
            result = await (await start_turn(self.client, turn, self.task_queue)).result()
            failed = [
                s.observation.text for s in result.steps if s.observation and not s.observation.ok
            ]
            if failed:
                raise RuntimeError(
                    f"task {task!r}: a lookup failed, the count means nothing: {failed}"
                )
            out[task] = result.usage.model_calls
        return out

    async def shields_cost(self, queues: dict[str, str], turns: int) -> dict[str, Any]:
        """One-tool turns with the default (offline) shields and with none, interleaved,
        either first in turn, each kind on a fresh worker of its own (`queues`: shielded,
        bare): a worker that has served the throughput batches spends more per turn
        than a fresh one (docs/benchmark.md, 2026-12-07)."""
        times: dict[str, list[float]] = {name: [] for name in queues}
        ids = {}
        order = list(queues.items())
        for i in range(turns):
            for name, queue in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                ids[name] = await self.agent(1, queue)
                times[name].append(time.perf_counter() - t0)
        shielded, bare = statistics.median(times["shielded"]), statistics.median(times["bare"])
        return {
            "shielded_median_ms": round(shielded * 1000, 2),
            "bare_median_ms": round(bare * 1000, 2),
            "latency_ratio": round(shielded / bare, 3),
            "events_one_tool_turn": {k: (await self.history(v))[0] for k, v in ids.items()},
        }

    async def streaming_cost(self, turns: int) -> dict[str, Any]:
        """One-tool turns with streaming off and on (a reader following the turn's
        stream meanwhile, as `ask --follow` does), interleaved, timed to the turn's
        result; then turns whose answer is written over about a second, for how long
        the text takes to reach a reader."""
        times: dict[str, list[float]] = {"off": [], "on": []}
        ids: dict[str, str] = {}
        for _ in range(turns):
            for name in ("off", "on"):
                turn = TurnInput(question=QUESTION, model="task:one tool", stream=name == "on")
                t0 = time.perf_counter()
                handle = await start_turn(self.client, turn, self.task_queue)
                reader = asyncio.create_task(read_all(self.client, handle.id, turn.stream))
                await handle.result()
                times[name].append(time.perf_counter() - t0)
                await reader
                ids[name] = handle.id
        delays: list[float] = []
        for _ in range(5):
            turn = TurnInput(question=QUESTION, model="timed", stream=True)
            handle = await start_turn(self.client, turn, self.task_queue)
            async for event in follow(self.client, handle.id):
                if isinstance(event, TokensEvent):
                    now = time.time()
                    delays += [now - float(t) for t in event.text.split()]
            ids["timed"] = handle.id
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        return {
            "off_median_ms": round(off * 1000, 2),
            "on_median_ms": round(on * 1000, 2),
            "latency_ratio": round(on / off, 3),
            "events_one_tool_turn": {k: (await self.history(v))[0] for k, v in ids.items()},
            "delivery_ms": {
                "median": round(statistics.median(delays) * 1000, 1),
                "p95": round(pct(delays, 0.95) * 1000, 1),
            },
        }

    async def history(self, workflow_id: str) -> tuple[int, int]:
        history = await self.client.get_workflow_handle(workflow_id).fetch_history()
        return len(history.events), sum(e.ByteSize() for e in history.events)


async def read_all(client: Client, turn_id: str, stream: bool) -> None:
    """Follow a turn's stream to its end, as `ask --follow` does (nothing when off)."""
    if stream:
        async for _event in follow(client, turn_id):
            pass


async def recovery(bench: Bench, address: str, db: Path, tmp: Path) -> float:
    """SIGKILL a worker right after a dispatch did its work; time from the new
    worker's start until the turn is done."""
    marker = tmp / "hung"
    doomed = spawn_worker(
        address, bench.task_queue, db, "--crash-after", "dispatch", "--marker", str(marker)
    )
    turn = TurnInput(question=QUESTION)
    handle = await start_turn(bench.client, turn, bench.task_queue)
    while not marker.exists():
        await asyncio.sleep(0.02)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    t0 = time.perf_counter()
    fresh = spawn_worker(address, bench.task_queue, db)
    try:
        await handle.result()
        return time.perf_counter() - t0
    finally:
        stop(fresh)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="durable-agent-bench-"))
    server = EmbeddedServer(tmp / "temporal.db", port=free_port(), ui_port=free_port()).start()
    worker = None
    try:
        client = await open_client({"target_host": server.address}, wait=30)
        task_queue = f"bench-{uuid.uuid4().hex[:6]}"
        db = tmp / "shop.db"
        worker = spawn_worker(server.address, task_queue, db)
        assert server.process is not None
        bench = Bench(client, task_queue, args.iterations, worker.pid, server.process.pid)

        print("warming up…", file=sys.stderr)
        for _ in range(5):
            await bench.agent()
            await bench.floor()

        print(f"latency: {args.turns} sequential turns of each…", file=sys.stderr)
        lat = await bench.latencies(args.turns)

        tput = {}
        for c in (50, 200):
            print(f"throughput at {c} concurrent turns…", file=sys.stderr)
            tput[c] = await bench.throughput(c)

        one_agent, many_agent = await bench.agent(1), await bench.agent(3)
        one_floor, many_floor = await bench.floor(1), await bench.floor(3)
        (ea1, ba1), (ea3, ba3) = await bench.history(one_agent), await bench.history(many_agent)
        (ef1, bf1), (ef3, bf3) = await bench.history(one_floor), await bench.history(many_floor)

        calls = await bench.model_calls()

        print("shields: the same turns with none, on two fresh workers…", file=sys.stderr)
        off = {setting: "none" for setting in SHIELD_SETTINGS.values()}
        twins = {}
        try:
            for name, env in (("shielded", {}), ("bare", off)):
                queue = f"bench-{name}-{uuid.uuid4().hex[:6]}"
                twins[queue] = spawn_worker(server.address, queue, db, env=env)
            names = dict(zip(("shielded", "bare"), twins, strict=True))
            for queue in twins:
                await bench.agent(1, queue)  # each worker's first turn is no measure
            shields = await bench.shields_cost(names, args.turns)
        finally:
            for proc in twins.values():
                stop(proc)

        print("streaming: the same turns with a reader, and its delays…", file=sys.stderr)
        streaming = await bench.streaming_cost(args.turns)

        extra: dict[str, Any] = {}
        if args.memory:
            print(f"memory: {MEMORY_TURNS} turns on a fresh worker…", file=sys.stderr)
            samples = await memory(bench, server.address, db)
            extra["memory_rss_mb"] = start_middle_end(samples)
            extra[f"memory_rss_mb_every_{MEMORY_SAMPLE_EVERY}_turns"] = samples
        if args.peers:
            print("peers: one-tool turns of every system, round by round…", file=sys.stderr)
            extra.update(
                await compare_peers(bench, server.address, server.process.pid, db, args.turns)
            )

        mem = {"worker": memory_mb(worker.pid), "server": memory_mb(server.process.pid)}
        worker.terminate()
        worker.wait()
        worker = None

        print("recovery after SIGKILL…", file=sys.stderr)
        rec = await recovery(bench, server.address, db, tmp)
        print("recovery with two workers, one SIGKILLed at random moments…", file=sys.stderr)
        kills = await kill_one_of_two(client, server.address, db)
    finally:
        if worker:
            worker.kill()
        server.stop()

    agent_med, floor_med = statistics.median(lat["agent"]), statistics.median(lat["floor"])
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "iterations_per_turn": args.iterations,
        "agent_model_calls": args.model_calls,
        "latency_ms": {
            "agent_median": round(agent_med * 1000, 2),
            "agent_p95": round(pct(lat["agent"], 0.95) * 1000, 2),
            "floor_median": round(floor_med * 1000, 2),
            "floor_p95": round(pct(lat["floor"], 0.95) * 1000, 2),
        },
        "latency_ratio": round(agent_med / floor_med, 3),
        "turns_per_s": {str(c): round(v["agent"], 2) for c, v in tput.items()},
        "floor_turns_per_s": {str(c): round(v["floor"], 2) for c, v in tput.items()},
        "throughput_ratio": round(min(v["agent"] / v["floor"] for v in tput.values()), 3),
        "events_per_iteration": (ea3 - ea1) / 2,
        "floor_events_per_iteration": (ef3 - ef1) / 2,
        "events_one_iteration_turn": {"agent": ea1, "floor": ef1},
        "history_bytes_per_iteration": {"agent": (ba3 - ba1) / 2, "floor": (bf3 - bf1) / 2},
        "cpu_ms_per_turn_at_200": bench.cpu_ms_per_turn,
        "recovery_s": round(rec, 2),
        "kills": kills,
        "model_calls": calls,
        "shields": shields,
        "streaming": streaming,
        "memory": mem,
        **extra,
    }


async def memory(bench: Bench, address: str, db: Path) -> list[float]:
    """RSS (MB) of a fresh agent worker over `MEMORY_TURNS` one-tool turns."""
    queue = f"bench-memory-{uuid.uuid4().hex[:6]}"
    worker = spawn_worker(address, queue, db)
    try:
        return await rss_over_turns(
            worker.pid,
            lambda: bench.agent(1, queue),
            MEMORY_TURNS,
            MEMORY_SAMPLE_EVERY,
            MEMORY_CONCURRENCY,
        )
    finally:
        stop(worker)


async def compare_peers(
    bench: Bench, address: str, server_pid: int, db: Path, turns: int
) -> dict[str, Any]:
    """The agent, the floor and each peer doing one-tool turns (`bench.peers.compare`)."""
    worker_pid = bench.pids["worker"]
    agent = peer_comparison.AgentSystem(bench.client, bench.task_queue, worker_pid)
    floor = peer_comparison.FloorSystem(bench.client, bench.task_queue, worker_pid)
    return await peer_comparison.compare(agent, floor, address, server_pid, db, turns)


def report(r: dict[str, Any]) -> str:
    lat = r["latency_ms"]
    rows = [
        ("latency per iteration, median (ms)", lat["agent_median"], lat["floor_median"]),
        ("latency per iteration, p95 (ms)", lat["agent_p95"], lat["floor_p95"]),
        *[
            (f"turns/s at {c} concurrent", r["turns_per_s"][c], r["floor_turns_per_s"][c])
            for c in r["turns_per_s"]
        ],
        (
            "history events per iteration",
            r["events_per_iteration"],
            r["floor_events_per_iteration"],
        ),
        *[
            (
                f"{proc} CPU per turn at 200 (ms)",
                r["cpu_ms_per_turn_at_200"]["agent"][proc],
                r["cpu_ms_per_turn_at_200"]["floor"][proc],
            )
            for proc in ("worker", "server")
        ],
        (
            "history bytes per iteration",
            r["history_bytes_per_iteration"]["agent"],
            r["history_bytes_per_iteration"]["floor"],
        ),
        ("worker memory, peak (MB)", r["memory"]["worker"]["peak_mb"], "—"),
        ("server memory, peak (MB)", r["memory"]["server"]["peak_mb"], "—"),
    ]
    local = r.get("agent_model_calls") == "local"
    how = "local activities" if local else "activities"
    lines = [f"the agent's model calls: {how}", ""]
    lines += [f"{'':40} {'agent':>10} {'floor':>10}"]
    lines += [f"{name:40} {a:>10} {f:>10}" for name, a, f in rows]
    checks = [
        ("latency_ratio", r["latency_ratio"], f"<= {TARGETS['latency_ratio']}"),
        ("throughput_ratio", r["throughput_ratio"], f">= {TARGETS['throughput_ratio']}"),
        ("recovery_s", r["recovery_s"], f"<= {TARGETS['recovery_s']}"),
        (
            f"kills: worst wait for a next step (s, {r['kills']['kills']} kills)",
            r["kills"]["next_step_s"]["max"],
            f"<= {TARGETS['recovery_s']}",
        ),
        ("kills: worst wait for the turn's code (s)", r["kills"]["code_runs_again_s"]["max"], "—"),
        ("events_per_iteration", r["events_per_iteration"], f"<= {MAX_EVENTS_PER_ITERATION}"),
    ]
    checks += [
        (f"model calls: {task}", n, f"== {EXPECTED_MODEL_CALLS[task]}")
        for task, n in r["model_calls"].items()
    ]
    checks.append(
        ("shields latency ratio (offline / none)", r["shields"]["latency_ratio"], "<= 1.05")
    )
    streaming = r["streaming"]
    checks.append(("streaming latency ratio (on / off)", streaming["latency_ratio"], "<= 1.10"))
    delivery = streaming["delivery_ms"]
    checks.append(
        ("stream delay, median / p95 (ms)", f"{delivery['median']} / {delivery['p95']}", "—")
    )
    if "memory_rss_mb" in r:
        rss = r["memory_rss_mb"]
        checks.append(
            (
                f"worker RSS over {MEMORY_TURNS} turns (MB)",
                f"{rss['start']} / {rss['middle']} / {rss['end']}",
                "flat",
            )
        )
    lines.append("")
    lines += [f"{name:40} {value:>10}   target {target}" for name, value, target in checks]
    if "peers" in r:
        lines += ["", peer_comparison.report(r)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m durable_agent.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument("--turns", type=int, default=40, help="sequential turns for latency")
    p.add_argument("--iterations", type=int, default=3, help="iterations per latency turn")
    p.add_argument(
        "--out",
        type=Path,
        help="results file (default bench-results.json, bench-long-results.json with --long)",
    )
    p.add_argument("--peers", action="store_true", help=f"compare with the peers ({peers.INSTALL})")
    p.add_argument("--memory", action="store_true", help=f"worker memory over {MEMORY_TURNS} turns")
    p.add_argument(
        "--model-calls",
        choices=("activity", "local"),
        default="activity",
        help="how the agent calls its model: each call an activity (as the peers do), or a "
        "local activity (Agent.model_calls)",
    )
    long = p.add_argument_group("long turns (--long)")
    long.add_argument(
        "--long", action="store_true", help="one turn of many steps over whole documents"
    )
    long.add_argument("--steps", type=int, default=1000, help="steps of the long turn")
    long.add_argument("--doc-kb", type=float, default=20, help="size of each document (kB)")
    long.add_argument(
        "--window",
        type=int,
        default=128_000,
        help="the model's context window in tokens (128,000: gpt-4o's; 32,000: a local model's)",
    )
    long.add_argument(
        "--realistic",
        action="store_true",
        help="the turn people run: 300 steps over 35 kB documents in a 32,000-token window "
        "(sets --steps, --doc-kb and --window)",
    )
    long.add_argument(
        "--write-every", type=int, default=100, help="a checkpoint every N steps (0: none)"
    )
    long.add_argument(
        "--kill-every",
        type=float,
        default=0,
        metavar="S",
        help="SIGKILL the worker about every S seconds and start another",
    )
    long.add_argument(
        "--kill-at-writes",
        action="store_true",
        help="also SIGKILL the worker right after each checkpoint is written",
    )
    long.add_argument("--no-peers", action="store_true", help="leave the peers out")
    long.add_argument(
        "--peer-budget", type=float, default=600, metavar="S", help="wall time each peer gets (s)"
    )
    long.add_argument(
        "--payload-store",
        choices=("local", "off"),
        default="local",
        help="large payloads in a folder beside the server (local), or inline",
    )
    args = p.parse_args(argv)
    if args.long:
        return main_long(args)
    if args.peers:
        try:
            peers.check_installed()
        except peers.PeersNotInstalled as e:
            print(f"python -m durable_agent.bench: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    # The agent's workers are processes of their own: they read it from the environment.
    os.environ[MODEL_CALLS_SETTING] = args.model_calls
    try:
        results = asyncio.run(run(args))
    finally:
        telemetry.flush()  # its client's spans, before os._exit or a traceback
    print(report(results))
    write(results, args.out or Path("bench-results.json"))


def main_long(args: argparse.Namespace) -> None:
    from durable_agent.bench import long

    if args.realistic:
        args.steps, args.doc_kb, args.window = 300, 35, 32_000

    # A turn allows at most 10,000 rounds, and the answer comes after the last read.
    if (
        not 1 <= args.steps < 10_000
        or not 0 < args.doc_kb <= 1_024  # a document is a tool result: 1 MB at most
        or min(args.write_every, args.kill_every) < 0
        or not 10_000 <= args.window <= 2_000_000
    ):
        print(
            "python -m durable_agent.bench --long: --steps from 1 to 9,999, --doc-kb above 0 "
            "and at most 1,024, --window from 10,000 to 2,000,000 tokens, "
            "--write-every and --kill-every 0 or more",
            file=sys.stderr,
        )
        raise SystemExit(2)
    options = long.LongOptions(
        steps=args.steps,
        doc_kb=args.doc_kb,
        write_every=args.write_every,
        window=args.window,
        kill_every=args.kill_every,
        kill_at_writes=args.kill_at_writes,
        # Peers say nothing about surviving kills: the variant runs the agent alone.
        peers=not (args.no_peers or args.kill_every or args.kill_at_writes),
        peer_budget_s=args.peer_budget,
        payload_store=args.payload_store,
    )
    try:
        results = asyncio.run(long.run(options))
    finally:
        telemetry.flush()
    print(long.report(results))
    write(results, args.out or Path("bench-long-results.json"))


def write(results: dict[str, Any], out: Path) -> None:
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwritten to {out}")
    sys.stdout.flush()
    os._exit(0)  # skip teardown under the SDK's runtime threads (see client.py)


if __name__ == "__main__":
    main()
