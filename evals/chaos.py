"""`--chaos`: a run's episodes served by worker processes that die at random moments.

    python -m durable_agent.evals tau2 --domain retail --model oracle --chaos

Two worker processes (`python -m durable_agent.evals worker ...`) serve the run's task queue with
transient faults injected into their model and tool calls (`AGENT_FAULTS`), and one
of them is SIGKILLed every 8 to 20 s, at whatever it was doing (a write applied
and not yet recorded, a model call half-way), then started again; the worker that
keeps the run's first write kills itself right after it (`wrote`), so even a short
run crashes once. Only a worker that
has served for the shorter of those times is killed: however slowly a loaded machine
starts one (the benchmark's imports), the run moves on. The episodes must
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
import time
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
enough for a worker started again (some seconds: the benchmark's imports) to serve.

Much shorter, and a busy machine's workers are killed faster than they get through a
turn's first workflow task (a fresh worker's replay and its local activities: a second
or more when the cores are shared). A task lost that way is Temporal's to give again
once its timeout passes, and past its third attempt Temporal lengthens that timeout
each time (5 s, 10 s, 20 s, ... up to 10 minutes): a turn whose task was lost nine
times in a row waited nine minutes. The tests kill every 4 to 8 s."""


READY = "AGENT_EVALS_READY"
"""Where a chaos worker process says it serves (a file it writes): the monkey kills
only workers that have served for a while."""


FIRST_WRITE = "AGENT_EVALS_FIRST_WRITE_DIES"
"""Where a run marks its first applied write (a file): the worker process that kept it
SIGKILLs itself right after, before Temporal hears of the result. Every chaos run so
crashes once at the worst moment, however short the run (a monkey on a clock could
miss a run that ends before its first kill)."""


def wrote() -> None:
    """Said by a chaos worker process right after a write is kept (a no-op in any other,
    and in all but the first write of the run): the call runs again on another worker,
    which finds it by its idempotency key."""
    path = os.environ.get(FIRST_WRITE)
    if not path:
        return
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def serving() -> None:
    """Said by a chaos worker process once its worker polls (a no-op in any other)."""
    path = os.environ.get(READY)
    if path:
        Path(path).write_text(str(os.getpid()))


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
    _numbers: list[int] = field(default_factory=list)
    """The number each worker was started as (its ready file's)."""
    _started: int = 0
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

    def _ready(self, n: int) -> Path:
        return self.store.with_suffix(f".worker-{n}.ready")

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        ready = self._ready(n)
        ready.unlink(missing_ok=True)
        env = {
            **os.environ,
            "AGENT_FAULTS": f"{FAULTS},seed={n}",
            READY: str(ready),
            FIRST_WRITE: str(self.store.with_suffix(".first-write")),
        }
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
        self.store.with_suffix(".first-write").unlink(missing_ok=True)
        self._workers = [self._start(n) for n in range(self.size)]
        self._numbers = list(range(self.size))
        self._started = self.size
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
        every = kill_every()
        while True:
            await self._pause(rng.uniform(*every))
            # A victim has served at least the shortest interval: one killed before it
            # served would be killed forever on a machine slow to start one.
            while not (victims := self._served(every[0])):
                await self._pause(0.2)
            victim = rng.choice(victims)
            worker = self._workers[victim]
            if worker.poll() is None:
                worker.kill()  # SIGKILL: no cleanup, whatever it was doing
                await asyncio.to_thread(worker.wait)
                self.kills += 1
            self._if_failed()
            self._restart(victim)

    async def _pause(self, seconds: float) -> None:
        """`seconds` of the monkey's time, starting again a worker that killed itself
        after the run's first write (`wrote`) as soon as it is gone."""
        deadline = time.monotonic() + seconds
        while True:
            self._if_failed()
            for i, worker in enumerate(self._workers):
                if worker.poll() == -signal.SIGKILL:
                    self.kills += 1
                    self._restart(i)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.2))

    def _restart(self, i: int) -> None:
        self._workers[i] = self._start(self._started)
        self._numbers[i] = self._started
        self._started += 1

    def _served(self, seconds: float) -> list[int]:
        """The workers that have served for `seconds` at least."""
        now = time.time()
        found = []
        for i, n in enumerate(self._numbers):
            try:
                since = self._ready(n).stat().st_mtime
            except FileNotFoundError:
                continue
            if now - since >= seconds:
                found.append(i)
        return found

    def _if_failed(self) -> None:
        for worker in self._workers:
            if worker.poll() is not None and worker.returncode not in (0, -signal.SIGKILL):
                raise ChaosError(f"a chaos worker exited with {worker.returncode}: see {self._log}")


class ChaosError(Exception):
    """A worker of a chaos run failed on its own (not killed): its log says why."""
