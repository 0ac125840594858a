"""Clean exits: `client.py ask`, a command the server's answer refuses, a ten-line script
that uses the client, and workers stopped with SIGTERM end with their own exit code and
nothing unexpected on standard error, every time, on a busy machine (two busy loops
share the cores with them).

The SDK's Tokio threads calling into Python as the interpreter finalizes once made
such processes abort now and then ("Fatal Python error: PyGILState_Release", rc 134):
`durable_agent.runtime.runtimes` ends them first. Every process here also carries a
witness (`tests/exit_witness`) that names, on standard error, any native thread still
alive when the interpreter starts finalizing: a run fails on the hazard itself, not
only on the abort it turns into one time in tens.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

ROOT = Path(__file__).resolve().parent.parent
WITNESS = Path(__file__).resolve().parent / "exit_witness"
RUNS = 10
"""Processes of each kind. The witness makes each one a probe of the hazard itself (with
the runtimes left running at exit, 13 of 13 processes were named, measured): tens of runs
of each kind, needed to meet the abort it turns into, are not needed to meet its cause."""
AT_ONCE = 2
"""Processes of one kind at a time; the three kinds run side by side."""
TIMEOUT_S = 120.0
QUESTION = "Which item was ordered for 123456?"
ANSWER = "Herbal Handsoap"
MISSING = "turn-nobody-0000"
REFUSED = f"error: no turn with workflow id {MISSING!r}\n"

SCRIPT = f"""\
import asyncio

from durable_agent.runtime.server import connect
from durable_agent.runtime.turns import start_turn
from durable_agent.types import TurnInput


async def main() -> None:
    conn = await connect()
    handle = await start_turn(conn.client, TurnInput(question={QUESTION!r}))
    print((await handle.result()).answer)


asyncio.run(main())
"""


@dataclass
class Ended:
    what: str
    code: int | None
    out: str
    err: str

    def __str__(self) -> str:
        return f"{self.what}: exit code {self.code}\n{self.err[-2000:] or self.out[-500:]}"


@pytest.fixture
def busy() -> Iterator[None]:
    """Two busy loops: the processes under test wait for a core, as on a loaded CI
    machine, which is what widens the window the abort needed."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in loops:
        p.kill()
        p.wait()


@pytest.fixture
def children(env: WorkflowEnvironment, tmp_path: Path) -> dict[str, str]:
    """The environment of every process the test starts: the session's dev server, a
    task queue and state folder of this test's own, and the witness."""
    inherited = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    return inherited | {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": f"exits-{uuid.uuid4().hex[:8]}",
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(WITNESS),
    }


async def run(what: str, args: list[str], environ: dict[str, str], cwd: Path) -> Ended:
    proc = await asyncio.create_subprocess_exec(
        *args,
        cwd=cwd,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    return Ended(what, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


class Worker:
    """`worker.py` as a person runs it, read until it says it is ready."""

    def __init__(self, proc: asyncio.subprocess.Process, what: str) -> None:
        self.proc = proc
        self.what = what
        self.out: list[str] = []

    @classmethod
    async def start(cls, what: str, environ: dict[str, str], cwd: Path) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "worker.py"),
            cwd=cwd,
            env=environ,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        worker = cls(proc, what)
        assert proc.stdout is not None
        while line := (await asyncio.wait_for(proc.stdout.readline(), TIMEOUT_S)).decode():
            worker.out.append(line)
            if line.startswith("worker ready"):
                break
        return worker

    async def stop(self) -> Ended:
        """SIGTERM, as a process manager stops it; then all it wrote."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), TIMEOUT_S)
        except asyncio.TimeoutError:
            self.proc.kill()
            out, err = await self.proc.communicate()
        text = "".join(self.out) + out.decode(errors="replace")
        return Ended(self.what, self.proc.returncode, text, err.decode(errors="replace"))


async def started_and_stopped(i: int, environ: dict[str, str], cwd: Path) -> Ended:
    worker = await Worker.start(f"worker {i}", environ, cwd)
    return await worker.stop()


async def in_turn(jobs: list[Coroutine[Any, Any, Ended]], at_once: int) -> list[Ended]:
    """The jobs, `at_once` at a time."""
    gate = asyncio.Semaphore(at_once)

    async def gated(job: Coroutine[Any, Any, Ended]) -> Ended:
        async with gate:
            return await job

    return list(await asyncio.gather(*(gated(j) for j in jobs)))


def unclean(ended: Ended, stderr: str = "") -> bool:
    """An exit other than 0 or a standard error other than `stderr` (a pattern)."""
    return ended.code != 0 or not re.fullmatch(stderr, ended.err)


@pytest.mark.usefixtures("busy")
async def test_commands_and_a_script_exit_cleanly_on_a_busy_machine(
    children: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "ask.py").write_text(SCRIPT)
    served = children | {"AGENT_TASK_QUEUE": children["AGENT_TASK_QUEUE"] + "-asked"}
    serving = await Worker.start("the serving worker", served, tmp_path)
    try:
        asks = [
            run(
                f"client.py ask {i}",
                [sys.executable, str(ROOT / "client.py"), "ask", QUESTION],
                served,
                tmp_path,
            )
            for i in range(RUNS)
        ]
        scripts = [
            run(f"script {i}", [sys.executable, "ask.py"], served, tmp_path) for i in range(RUNS)
        ]
        workers = [started_and_stopped(i, children, tmp_path) for i in range(RUNS)]
        # Refused on the server's answer: the failed call's future holds the client, and
        # a Tokio thread may let go of it last (`runtime.runtimes`).
        refusals = [
            run(
                f"client.py show {i}",
                [sys.executable, str(ROOT / "client.py"), "show", MISSING],
                served,
                tmp_path,
            )
            for i in range(RUNS)
        ]
        asked, scripted, stopped, refused = await asyncio.gather(
            in_turn(asks, AT_ONCE),
            in_turn(scripts, AT_ONCE),
            in_turn(workers, AT_ONCE),
            in_turn(refusals, AT_ONCE),
        )
    finally:
        last = await serving.stop()

    ended = [*asked, *scripted, *stopped, *refused, last]
    aborted = [e for e in ended if e.code in (-signal.SIGABRT, 128 + signal.SIGABRT)]
    assert not aborted, f"{len(aborted)} of {len(ended)} aborted; the first: {aborted[0]}"
    bad = [
        *(e for e in asked if unclean(e, r"turn \S+ started\n") or ANSWER not in e.out),
        *(e for e in scripted if unclean(e) or ANSWER not in e.out),
        *(e for e in [*stopped, last] if unclean(e) or "shutting down" not in e.out),
        *(e for e in refused if e.code != 1 or e.err != REFUSED),
    ]
    assert not bad, f"{len(bad)} of {len(ended)} did not end cleanly; the first: {bad[0]}"


RAISES = """\
import asyncio

from durable_agent.runtime.server import connect


async def main() -> None:
    conn = await connect()
    await conn.client.count_workflows()
    raise RuntimeError("a mistake of the script's own")


asyncio.run(main())
"""

KEEPS = """\
import asyncio

from durable_agent.runtime.server import connect

kept = []


async def main() -> None:
    kept.append(await connect())
    await kept[0].client.count_workflows()


asyncio.run(main())
"""


async def test_a_script_that_fails_still_ends_its_runtime(
    children: dict[str, str], tmp_path: Path
) -> None:
    """Its traceback, and nothing after it: the frames the traceback keeps (for a
    post-mortem that will not come) no longer keep the client's threads alive."""
    (tmp_path / "fails.py").write_text(RAISES)
    ended = await run("fails.py", [sys.executable, "fails.py"], children, tmp_path)
    assert ended.code == 1
    assert ended.err.startswith("Traceback (most recent call last):\n"), ended.err
    assert ended.err.endswith("RuntimeError: a mistake of the script's own\n"), ended.err


async def test_a_client_kept_past_the_end_is_named_at_exit(
    children: dict[str, str], tmp_path: Path
) -> None:
    """A client in a module global keeps its runtime's threads to the interpreter's end,
    where they can still abort it: the exit says so, and what to do."""
    (tmp_path / "keeps.py").write_text(KEEPS)
    ended = await run("keeps.py", [sys.executable, "keeps.py"], children, tmp_path)
    assert ended.code == 0
    lines = ended.err.splitlines()
    assert lines[0] == (
        "1 Temporal runtime(s) still in use at exit: a client or worker is still referenced "
        "(a module global, a call in flight), and its threads may meet the interpreter's end "
        "(a rare abort); let go of it before the program ends"
    ), ended.err
    assert lines[1].startswith("native threads alive as the interpreter finalizes"), ended.err
