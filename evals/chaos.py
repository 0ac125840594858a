"""`--chaos`: a run's episodes served by worker processes that die at random moments.

    python -m durable_agent.evals tau2 --domain retail --model oracle --chaos

Two worker processes (`python -m durable_agent.evals worker ...`) serve the run's task queue with
transient faults injected into their model and tool calls (`AGENT_FAULTS`), and one
of them is SIGKILLed every 8 to 20 s, at whatever it was doing (a write applied
and not yet recorded, a model call half-way), then started again. The episodes must
still end as the benchmark expects, every write applied once: what a crash leaves
is picked up by the other worker or the restarted one, from the turn's history and
the episode store's idempotency keys.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from durable_agent.runtime.server import stop_with_parent

T = TypeVar("T")

FAULTS = "rate=0.15"
"""Transient faults: the share of model and tool call attempts that fail (retried)."""
KILL_EVERY = (8.0, 20.0)
"""Seconds between two kills, drawn uniformly (`AGENT_EVALS_KILL_EVERY=8,20`): long
enough for a worker started again (some seconds: the benchmark's imports) to serve."""


def kill_every() -> tuple[float, float]:
    value = os.environ.get("AGENT_EVALS_KILL_EVERY", "").strip()
    if not value:
        return KILL_EVERY
    try:
        low, high = (float(v) for v in value.split(","))
    except ValueError:
        raise ChaosError(f"AGENT_EVALS_KILL_EVERY={value!r}: give two numbers, like 2,6") from None
    if not 0.5 <= low <= high <= 3600:
        raise ChaosError(f"AGENT_EVALS_KILL_EVERY={value!r}: give 0.5 <= low <= high <= 3600")
    return low, high


@dataclass
class WorkerPool:
    """`size` worker processes of a run, and the monkey that kills them."""

    domain: str
    task_ids: list[str]
    store: Path
    task_queue: str
    size: int = 2
    seed: int | None = None
    argv: list[str] = field(default_factory=list)
    """The worker command's arguments after `python -m durable_agent.evals`, for a suite other than
    τ²'s (AgentDojo's `dojo-worker ...`); by default τ²'s `worker` for `domain`."""
    kills: int = 0
    _workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _monkey: asyncio.Task[None] | None = None
    _log: Path | None = None

    def command(self) -> list[str]:
        if self.argv:
            return [sys.executable, "-m", "durable_agent.evals", *self.argv]
        # The installed package, not the folder: a run started from any folder works.
        return [
            sys.executable,
            "-m",
            "durable_agent.evals",
            "worker",
            "--domain",
            self.domain,
            "--tasks",
            ",".join(self.task_ids),
            "--store",
            str(self.store),
            "--task-queue",
            self.task_queue,
        ]

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "AGENT_FAULTS": f"{FAULTS},seed={n}"}
        assert self._log is not None
        with self._log.open("ab") as log:
            return subprocess.Popen(
                self.command(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                # A run killed whole takes its workers with it (they would serve on,
                # unseen, after the run is gone).
                preexec_fn=stop_with_parent,
            )

    async def __aenter__(self) -> WorkerPool:
        self._log = self.store.with_suffix(".workers.log")
        self._workers = [self._start(n) for n in range(self.size)]
        self._monkey = asyncio.create_task(self._kill_at_random())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._monkey is not None:
            self._monkey.cancel()
            await asyncio.gather(self._monkey, return_exceptions=True)
        for worker in self._workers:
            worker.send_signal(signal.SIGTERM)
        for worker in self._workers:
            try:
                await asyncio.to_thread(worker.wait, 30)
            except subprocess.TimeoutExpired:
                worker.kill()

    async def until_failed(self, work: Awaitable[T]) -> T:
        """`work`'s result; a worker that fails on its own ends the run with ChaosError."""
        assert self._monkey is not None
        task = asyncio.ensure_future(work)
        await asyncio.wait({task, self._monkey}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._monkey.result()  # raises what stopped it
        return task.result()

    async def _kill_at_random(self) -> None:
        rng = random.Random(self.seed)
        started = self.size
        every = kill_every()
        while True:
            await asyncio.sleep(rng.uniform(*every))
            victim = rng.randrange(len(self._workers))
            worker = self._workers[victim]
            if worker.poll() is None:
                worker.kill()  # SIGKILL: no cleanup, whatever it was doing
                await asyncio.to_thread(worker.wait)
                self.kills += 1
            elif worker.returncode not in (0, -signal.SIGKILL):
                raise ChaosError(f"a chaos worker exited with {worker.returncode}: see {self._log}")
            self._workers[victim] = self._start(started)
            started += 1


class ChaosError(Exception):
    """A worker of a chaos run failed on its own (not killed): its log says why."""
