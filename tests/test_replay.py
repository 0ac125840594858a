"""Determinism guard: stored histories of representative turns replay on the
current workflow code without a non-determinism error."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows import AgentTurn

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_stored() -> None:
    assert len(HISTORIES) >= 7, "run `python -m tests.record_histories`"


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_history_replays(path: Path) -> None:
    replayer = Replayer(workflows=[AgentTurn], data_converter=pydantic_data_converter)
    history = WorkflowHistory.from_json(f"replay-{path.stem}", path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
