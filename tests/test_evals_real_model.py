"""τ²-bench with a real model: each episode a durable conversation of the domain's
agent (our worker's `openai:test-model`) with the benchmark's own user simulator
(through LiteLLM), scored by the benchmark's own evaluator. One strict
OpenAI-compatible fake plays both sides, told apart by how their conversations
start: the customer's with the orchestrator's greeting, as the simulator sees it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from durable_agent.model import Reply
from durable_agent.tools import ToolSpec
from durable_agent.types import ToolCall
from tests.fakes.chat_completions import ChatCompletionsServer

tau2 = pytest.importorskip("evals.tau2")
if not os.environ.get("CI"):
    pytest.importorskip("tau2", reason='τ²-bench is not installed: pip install -e ".[evals]"')
pytest.importorskip("openai")

from durable_agent.evals.conversations import RealRun, real_totals, run_conversations  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TASK = "update_task_1"
"""The mock domain's: the customer wants task_1 marked as completed (one write, judged
by the database and what the agent said)."""
MODEL = "openai:test-model"
CUSTOMER_LINES = ("Hi, please mark task_1 as completed.", "Thanks, that is all. ###STOP###")


class Play:
    """The fake's brain for both sides. The customer says its lines in order (its
    turn is the number of lines it has said); the agent sets task_1's status to
    `statuses[n]` in its n-th episode, then says it is done."""

    def __init__(self, *statuses: str) -> None:
        self.statuses = statuses or ("completed",)
        self.episodes = 0
        self.before_line: Callable[[int], None] = lambda turn: None
        """Called as the customer is asked for line `turn` (a test's hook)."""

    def __call__(self, messages: list[Message], tools: list[ToolSpec]) -> Reply:
        first = messages[0]
        if isinstance(first, UserMessage) and first.text == tau2.FIRST_AGENT_MESSAGE:
            turn = sum(isinstance(m, AssistantMessage) for m in messages)
            self.before_line(turn)
            return Reply(text=CUSTOMER_LINES[turn])
        if isinstance(messages[-1], ToolResult):
            return Reply(text="Done: task_1 has its new status.")
        status = self.statuses[min(self.episodes, len(self.statuses) - 1)]
        self.episodes += 1
        arguments = {"task_id": "task_1", "status": status}
        return Reply(calls=[ToolCall(id="c1", name="update_task_status", arguments=arguments)])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChatCompletionsServer]:
    server = ChatCompletionsServer()
    # One endpoint for both: our openai backend and LiteLLM read the same variables.
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    try:
        yield server
    finally:
        server.close()


def customer_requests(server: ChatCompletionsServer) -> list[dict]:
    return [b for b in server.accepted if not b.get("tools")]


def agent_requests(server: ChatCompletionsServer) -> list[dict]:
    return [b for b in server.accepted if b.get("tools")]


async def test_the_right_write_gets_reward_1_and_a_rerun_asks_no_model_again(
    env: WorkflowEnvironment, fake: ChatCompletionsServer, tmp_path: Path
) -> None:
    fake.brain = Play("completed")
    run = RealRun("mock", MODEL, MODEL)
    tasks = tau2.tasks("mock", [TASK])
    (report,) = await run_conversations(
        env.client, run, tasks, state_dir=tmp_path, out=io.StringIO()
    )
    assert report.passed and report.reward == 1.0 and report.db_match
    assert report.termination == "user_stop" and report.turns == 1
    assert report.writes == report.expected_writes == 1
    assert (report.model_calls, report.customer_calls) == (2, 2)
    assert report.customer_input_tokens > 0 and report.input_tokens > 0
    assert report.history_events > 0
    # The customer was played by the simulator with the task's scenario, through LiteLLM.
    first = customer_requests(fake)[0]
    assert "mark an existing task as completed" in first["messages"][0]["content"]
    # The write ran once the customer consented (it waits for approval until then).
    store = tau2.EpisodeStore(next(tmp_path.glob("*.db")), "mock")
    assert store.writes(report.workflow_id) == [
        ("update_task_status", {"task_id": "task_1", "status": "completed"})
    ]

    asked = len(fake.requests)
    (again,) = await run_conversations(
        env.client, run, tasks, state_dir=tmp_path, out=io.StringIO()
    )
    assert again == replace(report, from_earlier=True)  # kept as it was, and says so
    assert len(fake.requests) == asked


async def test_the_wrong_write_gets_reward_0(
    env: WorkflowEnvironment, fake: ChatCompletionsServer, tmp_path: Path
) -> None:
    fake.brain = Play("pending")
    run = RealRun("mock", MODEL, MODEL)
    (report,) = await run_conversations(
        env.client, run, tau2.tasks("mock", [TASK]), state_dir=tmp_path, out=io.StringIO()
    )
    assert report.termination == "user_stop" and report.writes == 1
    assert not report.passed and report.reward == 0.0 and report.db_match is False


async def test_trials_give_pass_hat_k_as_the_benchmark_computes_it(
    env: WorkflowEnvironment, fake: ChatCompletionsServer, tmp_path: Path
) -> None:
    """Two trials, one episode after the other: the first passes, the second makes
    the wrong write. pass^1 is 1/2; pass^2 (both trials pass) is 0."""
    fake.brain = Play("completed", "pending")
    run = RealRun("mock", MODEL, MODEL, trials=2)
    reports = await run_conversations(
        env.client,
        run,
        tau2.tasks("mock", [TASK]),
        state_dir=tmp_path,
        concurrency=1,
        out=io.StringIO(),
    )
    assert sorted((r.trial, r.passed) for r in reports) == [(0, True), (1, False)]
    assert len({r.workflow_id for r in reports}) == 2
    total = real_totals(reports, trials=2)
    assert total["per_task"][TASK] == {"trials": 2, "passes": 1, "pass^1": 0.5, "pass^2": 0.0}
    assert (total["pass^1"], total["pass^2"]) == (0.5, 0.0)


def test_a_run_killed_mid_episode_goes_on_and_pays_no_call_twice(
    env: WorkflowEnvironment, fake: ChatCompletionsServer, tmp_path: Path
) -> None:
    """The client (and the worker in it) SIGKILLed while the simulator is asked for
    the customer's second line, after the agent's turn ended; the same command
    again finishes the episode. The fake is asked once for every call that finished
    before the kill: the customer's first line and both of the agent's calls."""
    command = [
        sys.executable,
        "-m",
        "evals",
        "tau2",
        "--domain",
        "mock",
        "--tasks",
        TASK,
        "--model",
        MODEL,
    ]
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))},
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
    }
    play = Play("completed")
    fake.brain = play
    first = subprocess.Popen(
        [*command, "--report", str(tmp_path / "first")],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def kill_on_second_line(turn: int) -> None:
        if turn == 1 and first.poll() is None:
            first.kill()
            first.wait()

    play.before_line = kill_on_second_line
    assert first.wait(120) == -9, "the run ended before it was killed"
    play.before_line = lambda turn: None
    again = subprocess.run(
        [*command, "--report", str(tmp_path / "again")],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1/1 passed" in again.stdout
    lines = Counter(
        sum(m["role"] == "assistant" for m in b["messages"]) for b in customer_requests(fake)
    )
    assert lines == {0: 1, 1: 2}, "line 0 was recorded: never asked again; line 1 was cut"
    bodies = [json.dumps(b, sort_keys=True) for b in agent_requests(fake)]
    assert len(bodies) == 2 == len(set(bodies))
    (report,) = json.loads(next((tmp_path / "again").glob("*.json")).read_text())["episodes"]
    assert report["reward"] == 1.0 and report["customer_calls"] == 2
