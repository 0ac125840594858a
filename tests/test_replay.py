"""Determinism guard: stored histories of representative turns replay on the
current workflow code without a non-determinism error.

`histories/` holds turns recorded by the current code (`python -m
tests.record_histories`); `histories/v0.1/` holds turns recorded before the
native tool loop (0.1), to pin down what an upgrade does to turns in flight:
every turn that had not asked `interpret` for more tools still replays; one that
had (an old-style "continue") fails its workflow task with a non-determinism
error, as the README's upgrade note says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from workflows import AgentTurn, Conversation

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json"))
V01 = sorted((HERE / "v0.1").glob("*.json"))
V01_CONTINUED = {"step_limit"}
"""0.1 turns whose `interpret` asked for more tools: they cannot continue on 0.2."""


async def replay(path: Path) -> BaseException | None:
    replayer = Replayer(workflows=[AgentTurn, Conversation], data_converter=pydantic_data_converter)
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
async def test_turns_of_the_previous_version(path: Path) -> None:
    failure = await replay(path)
    if path.stem in V01_CONTINUED:
        assert isinstance(failure, NondeterminismError)
    else:
        assert failure is None
