"""The replay gate: stored histories replay on the current workflow code without
a non-determinism error.

`histories/` holds turns and conversations recorded by the current code
(`python -m tests.record_histories`): approvals given and refused, a
conversation, a streamed turn, a sub-agent's turn and its parent. `histories/v0.2/`
holds those of the previous release: a change that would fail them must be
behind `workflow.patched` (or ship as a new worker version that turns in flight
are pinned away from, and say so here). The gate is shown to catch a change that
is not patched. `histories/v0.1/` holds turns recorded by 0.1, which screens no
question before `plan`: none of them can continue on this code, and each fails
with a non-determinism error, which is why those turns were drained, not
upgraded (docs/deploy.md). `histories/markers/` holds turns and a conversation
recorded while the turn still asked `workflow.patched` about four changes (quick
reads, return-direct rounds, checks before consent, named agents): the turn no
longer asks, so each of those turns fails here and finishes on the version it
started on (pinned), while the conversation, which moves to new code between
turns, replays.
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
RELEASED = sorted((HERE / "v0.2").glob("*.json"))
V01 = sorted((HERE / "v0.1").glob("*.json"))
MARKED = sorted((HERE / "markers").glob("*.json"))
MARKED_CHATS = [p for p in MARKED if p.stem == "conversation"]
MARKED_TURNS = [p for p in MARKED if p.stem != "conversation"]


async def replay(path: Path, turn: type = AgentTurn) -> BaseException | None:
    replayer = Replayer(workflows=[turn, Conversation], data_converter=LEAN_DATA_CONVERTER)
    id_file = path.with_suffix(".id")
    workflow_id = id_file.read_text().strip() if id_file.exists() else f"replay-{path.stem}"
    history = WorkflowHistory.from_json(workflow_id, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


def test_histories_are_stored() -> None:
    assert len(HISTORIES) >= 15, "run `python -m tests.record_histories`"
    assert {"approved", "conversation", "streamed", "sub_agent"} <= {p.stem for p in HISTORIES}
    assert len(RELEASED) == 12
    assert len(V01) == 7
    assert len(MARKED_TURNS) == 14 and len(MARKED_CHATS) == 1


@pytest.mark.parametrize(
    "path", HISTORIES + RELEASED + MARKED_CHATS, ids=lambda p: f"{p.parent.name}/{p.stem}"
)
async def test_history_replays(path: Path) -> None:
    assert await replay(path) is None


@pytest.mark.parametrize("name", ["approved", "order_answered"])
async def test_the_gate_catches_a_change_that_is_not_patched(name: str) -> None:
    """The deploy drill's version 2 (one step more, not behind `workflow.patched`)."""
    from tests.drill_worker import ChangedTurn

    assert isinstance(
        await replay(HERE / "v0.2" / f"{name}.json", ChangedTurn), NondeterminismError
    )


@pytest.mark.parametrize("path", V01, ids=lambda p: p.stem)
async def test_turns_of_the_previous_version_fail_clearly(path: Path) -> None:
    assert isinstance(await replay(path), NondeterminismError)


@pytest.mark.parametrize("path", MARKED_TURNS, ids=lambda p: p.stem)
async def test_turns_that_asked_about_the_dropped_patches_stay_on_their_version(
    path: Path,
) -> None:
    failure = await replay(path)
    assert isinstance(failure, NondeterminismError)
    assert "patch marker" in str(failure)
