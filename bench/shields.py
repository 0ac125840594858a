"""What the default shields cost a one-tool turn, alone (the full bench takes ten minutes).

    python -m durable_agent.bench.shields [--turns 100] [--model-calls local|activity]

Starts its own dev server and two bench workers, one with the default offline shields
and one with none (`AGENT_SHIELDS_*=none`), and runs the bench's one-tool turn on each in
turn (interleaved, either first in turn, so load on the machine falls on both alike).
Prints the medians, their ratio, the CPU its worker and the server spent per turn, and
what one turn of each records: history events and bytes, workflow tasks, and the local
activities (markers) by type. The same turns as `Bench.shields_cost`.

`--age N --aged shielded` first runs N turns on that worker (`--at-once` of them at a
time, 50 by default), as the full bench's shielded worker once had served its
throughput batches when the bare one was fresh; `--pid-file` gives the workers' pids to
a profiler (`py-spy record -p PID`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from durable_agent.bench import QUESTION
from durable_agent.bench.measure import cpu_s, pct, spawn_worker, stop
from durable_agent.bench.worker import MODEL_CALLS_SETTING
from durable_agent.runtime.server import EmbeddedServer, free_port, open_client
from durable_agent.runtime.turns import start_turn
from durable_agent.shields import SETTINGS as SHIELD_SETTINGS
from durable_agent.types import TurnInput


async def one_turn(client: Client, queue: str) -> str:
    handle = await start_turn(client, TurnInput(question=QUESTION, model="offline"), queue)
    result = await handle.result()
    assert "Herbal Handsoap" in result.answer, result.answer
    return handle.id


async def recorded(client: Client, workflow_id: str) -> dict[str, Any]:
    """What one turn's history holds: events, bytes, workflow tasks, markers by type."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    markers: Counter[str] = Counter()
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            data = e.marker_recorded_event_attributes.details.get("data")
            kind = json.loads(data.payloads[0].data).get("activity_type", "?") if data else "?"
            markers[kind] += 1
    completed = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    tasks = sum(e.event_type == completed for e in history.events)
    return {
        "events": len(history.events),
        "bytes": sum(e.ByteSize() for e in history.events),
        "workflow_tasks": tasks,
        "markers": dict(markers),
    }


async def run(
    turns: int,
    model_calls: str,
    pid_file: Path | None,
    age: int = 0,
    aged: tuple[str, ...] = (),
    at_once: int = 50,
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="durable-agent-shields-"))
    server = EmbeddedServer(tmp / "temporal.db", port=free_port(), ui_port=free_port()).start()
    env = {MODEL_CALLS_SETTING: model_calls}
    off = {setting: "none" for setting in SHIELD_SETTINGS.values()}
    queues = {"shielded": f"sh-{uuid.uuid4().hex[:6]}", "bare": f"bare-{uuid.uuid4().hex[:6]}"}
    workers = {}
    try:
        client = await open_client({"target_host": server.address}, wait=30)
        db = tmp / "shop.db"
        workers["shielded"] = spawn_worker(server.address, queues["shielded"], db, env=env)
        workers["bare"] = spawn_worker(server.address, queues["bare"], db, env={**env, **off})
        if pid_file:
            pid_file.write_text(json.dumps({k: w.pid for k, w in workers.items()}))
        for _ in range(5):
            for queue in queues.values():
                await one_turn(client, queue)
        for name in aged:
            # As in the full bench, where the shielded turns run on a worker that has
            # served its throughput batches and the bare ones on a fresh worker.
            for _ in range(0, age, at_once):
                await asyncio.gather(*(one_turn(client, queues[name]) for _ in range(at_once)))
        print(f"{turns} turns of each, interleaved…", file=sys.stderr, flush=True)
        times: dict[str, list[float]] = {name: [] for name in queues}
        cpu = dict.fromkeys(queues, 0.0)
        server_cpu = dict.fromkeys(queues, 0.0)
        assert server.process is not None
        server_pid = server.process.pid
        ids = {}
        order = list(queues.items())
        for i in range(turns):
            # Either first in turn: a pair's first turn may pay for a pause before it.
            for name, queue in order if i % 2 == 0 else order[::-1]:
                c0, s0 = cpu_s(workers[name].pid), cpu_s(server_pid)
                t0 = time.perf_counter()
                ids[name] = await one_turn(client, queue)
                times[name].append(time.perf_counter() - t0)
                cpu[name] += cpu_s(workers[name].pid) - c0
                server_cpu[name] += cpu_s(server_pid) - s0
        med = {name: statistics.median(ts) for name, ts in times.items()}
        return {
            "model_calls": model_calls,
            "turns_each": turns,
            "median_ms": {k: round(v * 1000, 2) for k, v in med.items()},
            "p95_ms": {k: round(pct(v, 0.95) * 1000, 2) for k, v in times.items()},
            "latency_ratio": round(med["shielded"] / med["bare"], 3),
            # Each turn against its neighbour of the other kind: less swayed by load that
            # comes and goes over the run.
            "pair_ratio_median": round(
                statistics.median(
                    a / b for a, b in zip(times["shielded"], times["bare"], strict=True)
                ),
                3,
            ),
            "worker_cpu_ms_per_turn": {k: round(v * 1000 / turns, 2) for k, v in cpu.items()},
            "server_cpu_ms_per_turn": {
                k: round(v * 1000 / turns, 2) for k, v in server_cpu.items()
            },
            "one_turn": {name: await recorded(client, i) for name, i in ids.items()},
            "aged": {name: {"turns": age, "at_once": at_once} for name in aged},
            "load_avg": os.getloadavg(),
        }
    finally:
        for w in workers.values():
            stop(w)
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=100)
    p.add_argument("--model-calls", choices=("local", "activity"), default="local")
    p.add_argument("--pid-file", type=Path, help="write the workers' pids here (to profile)")
    p.add_argument("--age", type=int, default=0, help="turns first run by…")
    p.add_argument("--aged", nargs="*", choices=("shielded", "bare"), default=[], help="…these")
    p.add_argument("--at-once", type=int, default=50, help="…so many at once")
    args = p.parse_args()
    aged = tuple(args.aged)
    out = asyncio.run(
        run(args.turns, args.model_calls, args.pid_file, args.age, aged, args.at_once)
    )
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
