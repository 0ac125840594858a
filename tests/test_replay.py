"""Determinism guard: stored histories of representative turns replay on the
current workflow code without a non-determinism error.

`histories/` holds turns recorded by the current code (`python -m
tests.record_histories`); `histories/v0.1/` holds turns recorded by 0.1, to pin
down what an upgrade does to turns in flight: 0.2 screens the question with the
input shields before `plan`, so no 0.1 turn can continue on a 0.2 worker; each
fails its workflow task with a non-determinism error, as the README's upgrade
note says (drain 0.1 workers first).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from workflows import AgentTurn, Conversation

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json"))
V01 = sorted((HERE / "v0.1").glob("*.json"))


async def replay(path: Path) -> BaseException | None:
    replayer = Replayer(workflows=[AgentTurn, Conversation], data_converter=LEAN_DATA_CONVERTER)
    id_file = path.with_suffix(".id")
    workflow_id = id_file.read_text().strip() if id_file.exists() else f"replay-{path.stem}"
    history = WorkflowHistory.from_json(workflow_id, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


def test_histories_are_stored() -> None:
    assert len(HISTORIES) >= 11, "run `python -m tests.record_histories`"
    assert len(V01) == 7


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_history_replays(path: Path) -> None:
    assert await replay(path) is None


@pytest.mark.parametrize("path", V01, ids=lambda p: p.stem)
async def test_turns_of_the_previous_version_fail_clearly(path: Path) -> None:
    assert isinstance(await replay(path), NondeterminismError)
