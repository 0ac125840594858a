"""What the benchmark reads from its processes: worker processes it starts, their CPU
time and memory, batches of turns, and percentiles of what it timed."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any


def spawn(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start `python -m module args…`; return once it prints
    "ready" (a worker polling its queue), so no timing includes a start-up."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"{module} did not start (exit code {proc.wait()}): see its stderr")
    # What it prints later (Temporal Core's warnings go to stdout by default) must be
    # read: a full pipe would block the Core thread that writes it, and with it the
    # worker's polling.
    threading.Thread(target=shutil.copyfileobj, args=(proc.stdout, sys.stderr), daemon=True).start()
    return proc


def spawn_worker(
    address: str, task_queue: str, db: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """The agent's worker (`bench.worker`): agent turns and the floor."""
    return spawn("durable_agent.bench.worker", address, task_queue, str(db), *extra, env=env)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mb(pid: int) -> dict[str, float]:
    """Resident memory now and at its peak."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss_mb": round(fields.get("VmRSS", 0), 1), "peak_mb": round(fields.get("VmHWM", 0), 1)}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def batches(
    systems: Mapping[str, tuple[Callable[[], Awaitable[Any]], Mapping[str, int]]],
    concurrency: int,
    rounds: int,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Each system's turns per second with `concurrency` turns at once, and the CPU
    (ms) a turn costs each of its processes: the medians over `rounds` batches, the
    systems taking turns in an order rotated every round. `systems`: name → (one turn,
    the pids its turns are charged to). The median, not the sum: now and then one
    batch on this kind of machine takes twice as long whichever system runs it, and
    one such batch must not decide a ratio."""
    names = list(systems)
    rates: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, dict[str, list[float]]] = {n: {k: [] for k in systems[n][1]} for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            turn, pids = systems[name]
            cpu0 = {k: cpu_s(pid) for k, pid in pids.items()}
            t0 = time.perf_counter()
            await asyncio.gather(*(turn() for _ in range(concurrency)))
            rates[name].append(concurrency / (time.perf_counter() - t0))
            for k, pid in pids.items():
                cpu[name][k].append((cpu_s(pid) - cpu0[k]) * 1000 / concurrency)
    per_turn = {
        n: {k: round(statistics.median(v), 1) for k, v in used.items()} for n, used in cpu.items()
    }
    return {n: statistics.median(v) for n, v in rates.items()}, per_turn
