"""`python -m durable_agent.evals replay RUN_ID --model SPEC`: an oracle run of τ²-bench
episodes asked again of another model, its tool calls answered from the record while
they repeat the recording's, live on a copy of the episode's database from the first
that does not, and scored by the benchmark's evaluator."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.types import StepKind, ToolCall

tau2 = pytest.importorskip("durable_agent.evals.tau2")
if not os.environ.get("CI"):
    pytest.importorskip("tau2", reason='τ²-bench is not installed: pip install -e ".[evals]"')

from durable_agent.evals.replay import ReplayError, replay_id, replay_run  # noqa: E402
from durable_agent.evals.run import (  # noqa: E402
    Records,
    episode_id,
    question_of,
    run_id,
    run_tasks,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tool_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """The tools' calls, by the database file they ran on (the worker runs here); a
    call's attempts (a retried activity, on a busy machine) count once, by its key."""
    counted: Counter[str] = Counter()
    seen: set[tuple[str, str]] = set()
    call = tau2.EpisodeStore.call

    def counting(self: Any, episode: str, key: str, *args: Any, **kwargs: Any) -> str:
        if (self.path.name, key) not in seen:
            seen.add((self.path.name, key))
            counted[self.path.name] += 1
        return call(self, episode, key, *args, **kwargs)

    monkeypatch.setattr(tau2.EpisodeStore, "call", counting)
    return counted


async def recorded(env: WorkflowEnvironment, state: Path, ids: list[str]) -> str:
    """An oracle run of the tasks `ids`; its id."""
    tasks = tau2.tasks("retail", ids)
    reports = await run_tasks(env.client, "retail", tasks, state_dir=state, out=io.StringIO())
    assert all(r.passed for r in reports)
    return run_id("retail", "oracle", ids, state_dir=state)


async def test_an_oracle_run_replayed_with_its_oracle_diverges_nowhere_and_calls_no_tool(
    env: WorkflowEnvironment,
    tmp_path: Path,
    tool_calls: Counter[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = await recorded(env, tmp_path, ["0"])
    ran = tool_calls[f"{run}.db"]
    assert ran == 5
    out = io.StringIO()
    name, (report,) = await replay_run(env.client, run, "oracle", state_dir=tmp_path, out=out)

    assert tool_calls[f"{name}.db"] == 0 and tool_calls[f"{run}.db"] == ran
    assert report.diverged_at is None and report.live_tool_calls == 0
    assert report.saved_tool_calls == report.recorded_tool_calls == 5
    assert report.passed and report.store_matches_gold and report.writes == 1
    header, row = out.getvalue().split("task  pass")[1].splitlines()[:2]
    assert row.split()[:6] == ["0", "pass", "1.00", "nowhere", "5/5", "0"], out.getvalue()

    # The same command again takes the episode as it was.
    _, (again,) = await replay_run(env.client, run, "oracle", state_dir=tmp_path, out=io.StringIO())
    assert again.from_earlier and again.workflow_id == report.workflow_id

    # A model the worker has, whose backend cannot start: one line, and nothing kept.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(
        ReplayError, match=r"its model cannot be used: openai:m failed \(request rejected\)"
    ):
        await replay_run(env.client, run, "openai:m", state_dir=tmp_path, out=io.StringIO())
    refused = replay_id(run, "openai:m", tmp_path)
    assert Records(tmp_path / f"{refused}.db").finished(f"{report.original}-{refused}") is None


@dataclass
class Detour:
    """Each task's expected actions, in order, but for a look at the customer's
    details at step 3 that the oracle did not take: it goes wrong there."""

    actions: dict[str, list[tuple[str, dict[str, Any]]]]
    provider: str = "detour"
    name: str = "detour"

    async def plan(self, request: ModelRequest, stream: Any = None) -> Reply:
        return self._next(request)

    async def interpret(self, request: ModelRequest, stream: Any = None) -> Reply:
        return self._next(request)

    def _next(self, request: ModelRequest) -> Reply:
        from durable_agent.conversation import ToolResult, UserMessage

        question = next(m.text for m in request.messages if isinstance(m, UserMessage))
        done = sum(isinstance(m, ToolResult) for m in request.messages)
        planned = list(self.actions[question])
        planned.insert(2, ("get_user_details", {"user_id": "ethan_garcia_1261"}))
        if done >= len(planned):
            return Reply(text="Done.")
        tool, arguments = planned[done]
        return Reply(calls=[ToolCall(id=f"detour_{done + 1}", name=tool, arguments=arguments)])


async def test_a_model_gone_wrong_at_step_3_runs_live_from_there_on_a_copy_and_is_scored(
    env: WorkflowEnvironment, tmp_path: Path, tool_calls: Counter[str]
) -> None:
    """Task 22 changes the customer's address at step 2; the detour at step 3 reads it
    live, from the episode's copy, which has the write the record answered for."""
    run = await recorded(env, tmp_path, ["22"])
    (task,) = tau2.tasks("retail", ["22"])
    original = tau2.EpisodeStore(tmp_path / f"{run}.db", "retail")
    episode = episode_id(run, "22")
    before = original.trajectory(episode)
    detour = Detour({question_of(task): tau2.expected_actions(task)})
    models = ModelCatalog({"detour": lambda _: detour}, default="detour")
    name, (report,) = await replay_run(
        env.client, run, "detour", state_dir=tmp_path, models=models, out=io.StringIO()
    )

    assert report.diverged_at == 3 and report.model_calls == 9  # 8 calls, then the answer
    assert (report.saved_tool_calls, report.recorded_tool_calls) == (2, 7)
    assert report.live_tool_calls == tool_calls[f"{name}.db"] == 6  # the detour and the rest
    # Scored by the benchmark's evaluator: every expected write once, on the copy.
    assert report.passed and report.reward == 1.0 and report.store_matches_gold
    assert report.writes == report.expected_writes == 3
    copy = tau2.EpisodeStore(tmp_path / f"{name}.db", "retail")
    calls = copy.keyed_calls(episode)
    assert [key.split("/")[-2:] for key, *_ in calls[:2]] == [["recorded", "0"], ["recorded", "1"]]
    assert [tool for _, tool, _, _ in calls] == [
        *(tool for tool, _ in tau2.expected_actions(task)[:2]),
        "get_user_details",
        *(tool for tool, _ in tau2.expected_actions(task)[2:]),
    ]
    assert "101 Highway" in calls[2][3]  # the recorded write is in the copy
    assert original.trajectory(episode) == before  # the recorded run's database untouched
    output = await _agents(env, name).turn(report.workflow_id).result()
    kinds = [s.kind for s in output.steps if s.calls and s.kind is not StepKind.SHIELD]
    assert kinds.count(StepKind.RECORDED) == 2 and kinds.count(StepKind.TOOL_CALL) == 6


def _agents(env: WorkflowEnvironment, task_queue: str) -> Any:
    from durable_agent.client import AgentClient

    return AgentClient(env.client, task_queue=task_queue)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["tau2-retail-00000000", "--model", "oracle"],
            "error: no eval run 'tau2-retail-00000000' in ",
        ),
        (["tau2-retail-0badc0de", "--model", "nosuch:x"], "the worker has no such model"),
        (["tau2-retail-c0ffee00", "--model", "oracle"], "its episodes are conversations"),
        (["replay-0badc0de", "--model", "oracle"], "error: replay-0badc0de is a replay"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    """Before any server is asked (there is none here)."""
    state = tmp_path / "evals"
    state.mkdir()
    Records(state / "tau2-retail-0badc0de.db").finish(
        "tau2-retail-0badc0de-0", {"task": "0", "workflow_id": "tau2-retail-0badc0de-0"}
    )
    Records(state / "tau2-retail-c0ffee00.db").finish(
        "tau2-retail-c0ffee00-0-0",
        {"task": "0", "workflow_id": "tau2-retail-c0ffee00-0", "termination": "user_stop"},
    )
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.evals", "replay", *args],
        cwd=ROOT,
        env={**os.environ, "AGENT_STATE_DIR": str(tmp_path), "TEMPORAL_ADDRESS": "127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done.stderr
    assert done.stdout == ""
