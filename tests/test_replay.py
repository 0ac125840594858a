"""The replay gate: stored histories replay on the current workflow code without
a non-determinism error, or are shown to need the version they started on.

`histories/` holds turns and conversations recorded by the current code
(`python -m tests.record_histories`): approvals given and refused, a
conversation, a streamed turn, a sub-agent's turn and its parent, a typed turn
whose value was repaired once, a fork of a turn (`client.py rerun`), forks of a turn
whose instructions are a function (as it ran, and on the agent as served now after a
fix: `rerun --current`), a fork and a turn whose second copy of a waived write asked
for consent, a turn of an agent with
an MCP server (its tool list recorded by hash), and turns that
continued as new, run by run (`<name>.run<n>`: a long turn, and one whose write
waited for consent across a continue-as-new). They must replay (a worker that picks
up a turn after a crash replays it), and a change that is not patched is shown to
fail them. `local_activity_timed_out` is a turn of an MCP agent whose `parse` timed out
three times over many extended workflow tasks (recorded from `tests/test_mcp.py`'s
killed-worker test with parse slowed past `PARSE_TIMEOUT`; `record_histories` does not
make it): the SDK raises a local activity's timeout one way when it runs and another
when it is replayed, and the turn must take the same path both times.

Turns and conversations are pinned to the version (code and agents) they
started on, run by run (`durable_agent/runtime/deployments.py`, the drill in
`tests/test_versioning.py`): a conversation moves to new code only by continuing
as new between turns, so the code of both changes freely. Conversations of the
builds before that ran auto-upgrade, and replay once on the code that pins them,
so every stored conversation of an earlier build must replay here. The turns of
earlier builds are kept to show which of them could not continue here:

- `histories/v0.1/`: 0.1 screened no question before `plan`; none continues here.
- `histories/v0.2/`: 0.2 screened a round's calls in a shield activity after
  `parse`, and ran under a `max_duration` timer (below), so only a 0.2 turn whose
  question was refused continues here.
- `histories/markers/`: recorded while the turn asked `workflow.patched` about
  four changes (quick reads, return-direct rounds, checks before consent, named
  agents); this code no longer asks, so none of those turns continues here.
- `histories/timer/`: recorded while a turn ran under a `max_duration` timer; this
  code bounds each activity by the time left instead, so only a turn that never
  started the timer (its question refused) continues here.
- `histories/inline_tools/`: the MCP turn, recorded while a turn's first step carried
  each server's tool list itself rather than its hash; it continues here.
- `histories/before_memo/`: turns that waited for a decision, recorded before a turn
  listed the calls awaiting one in its memo (for a while after, it asked
  `workflow.patched` about that; a patch checked halfway through a turn made queries
  fail on a worker that took the turn over); none of them continues here.
- `histories/before_parse_ahead/`: the turn of local model calls, recorded while each
  reply's calls were parsed by a `parse` local activity of their own (now the model
  call parses them, and a reply recorded without its calls parsed is parsed as before);
  it continues here, parsing as it did.
"""

from __future__ import annotations

import ast
import base64
import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from durable_agent.workflows import AgentTurn, Conversation

HERE = Path(__file__).parent / "histories"
HISTORIES = sorted(HERE.glob("*.json"))
V01 = sorted((HERE / "v0.1").glob("*.json"))
V02 = sorted((HERE / "v0.2").glob("*.json"))
MARKED = sorted((HERE / "markers").glob("*.json"))
TIMED = sorted((HERE / "timer").glob("*.json"))
INLINE_TOOLS = sorted((HERE / "inline_tools").glob("*.json"))
BEFORE_MEMO = sorted((HERE / "before_memo").glob("*.json"))
BEFORE_PARSE_AHEAD = sorted((HERE / "before_parse_ahead").glob("*.json"))
EARLIER_CHATS = [p for p in V02 + MARKED + TIMED if p.stem == "conversation"]


def started_a_timer(path: Path) -> bool:
    """The turn started a `max_duration` timer (turns of earlier builds did)."""
    summary = base64.b64encode(b'"max_duration"').decode()
    return any(
        "timerStartedEventAttributes" in e
        and e.get("userMetadata", {}).get("summary", {}).get("data") == summary
        for e in json.loads(path.read_text())["events"]
    )


V02_TURNS = [p for p in V02 if p.stem != "conversation"]
MARKED_TURNS = [p for p in MARKED if p.stem != "conversation"]
TIMED_TURNS = [p for p in TIMED if p.stem != "conversation"]


async def replay(
    path: Path, turn: type = AgentTurn, chat: type = Conversation
) -> BaseException | None:
    replayer = Replayer(workflows=[turn, chat], data_converter=LEAN_DATA_CONVERTER)
    id_file = path.with_suffix(".id")
    workflow_id = id_file.read_text().strip() if id_file.exists() else f"replay-{path.stem}"
    history = WorkflowHistory.from_json(workflow_id, path.read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


def test_histories_are_stored() -> None:
    assert len(HISTORIES) >= 15, "run `python -m tests.record_histories`"
    assert {
        "approved",
        "conversation",
        "streamed",
        "sub_agent",
        "typed",
        "mcp_tools",
        "fork_write_asked",
        "write_asked_again",
        "forked_as_ran",
        "forked_current",
    } <= {p.stem for p in HISTORIES}
    assert "local_activity_timed_out" in {p.stem for p in HISTORIES}
    assert [p.stem for p in INLINE_TOOLS] == ["mcp_tools"]
    continued = {p.stem for p in HISTORIES if ".run" in p.stem}
    assert {"long_turn.run3", "consent_across_runs.run2"} <= continued
    assert (len(V01), len(V02), len(MARKED), len(TIMED), len(EARLIER_CHATS)) == (7, 12, 15, 15, 3)
    assert [p.stem for p in BEFORE_MEMO] == [
        "approved",
        "consent_across_runs.run1",
        "consent_across_runs.run2",
        "declined_by_person",
    ]
    assert [p.stem for p in BEFORE_PARSE_AHEAD] == ["local_calls"]
    assert sum(map(started_a_timer, V02_TURNS)) == 10
    assert sum(map(started_a_timer, TIMED_TURNS)) == 13
    assert not any(map(started_a_timer, HISTORIES))


@pytest.mark.parametrize(
    "path",
    HISTORIES + EARLIER_CHATS + INLINE_TOOLS + BEFORE_PARSE_AHEAD,
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
async def test_history_replays(path: Path) -> None:
    assert await replay(path) is None


def local_activities(path: Path) -> list[str]:
    """The local activities a stored history records (their markers), in order."""
    found = []
    for event in json.loads(path.read_text())["events"]:
        details = event.get("markerRecordedEventAttributes", {}).get("details", {})
        if "data" in details:
            data = json.loads(base64.b64decode(details["data"]["payloads"][0]["data"]))
            found.append(data["activity_type"])
    return found


def test_both_ways_of_parsing_a_local_calls_reply_are_replayed() -> None:
    """Before 10c37fa each round's calls had a `parse` of their own; since,
    the model call that gave them parses them (its result holds them)."""
    before = local_activities(HERE / "before_parse_ahead/local_calls.json")
    now = local_activities(HERE / "local_calls.json")
    assert before.count("parse") == 3 and "parse" not in now
    assert [k for k in before if k != "parse"] == now
    assert b'"parsed":{"valid":' in payloads(HERE / "local_calls.json")


def payloads(path: Path) -> bytes:
    """Every payload's data in a stored history, decoded (the histories are not
    encrypted)."""
    found: list[bytes] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "data" and isinstance(value, str):
                    found.append(base64.b64decode(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(path.read_text()))
    return b"\n".join(found)


def test_an_mcp_turn_records_its_tool_list_by_hash() -> None:
    """The server's tool specs (`The find of a thing.`) were in the history of a turn
    recorded before lists were kept by hash; now only the list's hash is."""
    now, before = payloads(HERE / "mcp_tools.json"), payloads(HERE / "inline_tools/mcp_tools.json")
    assert b"The find of a thing." in before and b"tool_lists" not in before
    assert b"The find of a thing." not in now and b'"tool_lists":{"evil":"' in now


@pytest.mark.parametrize(
    "name", ["approved", "order_answered", "long_turn.run2", "consent_across_runs.run2"]
)
async def test_the_gate_catches_a_change_that_is_not_patched(name: str) -> None:
    """The deploy drill's version 2 (one step more, not behind `workflow.patched`)."""
    from tests.drill_worker import ChangedTurn

    history = HERE / f"{name}.json"
    assert await replay(history) is None
    assert isinstance(await replay(history, ChangedTurn), NondeterminismError)


async def test_the_gate_catches_a_change_of_the_conversation() -> None:
    from tests.drill_worker import ChangedConversation

    history = HERE / "conversation.json"
    assert await replay(history) is None
    assert isinstance(await replay(history, chat=ChangedConversation), NondeterminismError)


@pytest.mark.parametrize("path", V01, ids=lambda p: p.stem)
async def test_turns_of_0_1_fail_clearly(path: Path) -> None:
    assert isinstance(await replay(path), NondeterminismError)


@pytest.mark.parametrize("path", V02_TURNS, ids=lambda p: p.stem)
async def test_turns_of_0_2_continue_here_only_if_their_question_was_refused(path: Path) -> None:
    assert (await replay(path) is None) is not started_a_timer(path)


@pytest.mark.parametrize("path", MARKED_TURNS, ids=lambda p: p.stem)
async def test_turns_that_asked_about_the_dropped_patches_stay_on_their_version(
    path: Path,
) -> None:
    failure = await replay(path)
    assert isinstance(failure, NondeterminismError)
    assert "patch marker" in str(failure)


@pytest.mark.parametrize("path", TIMED_TURNS, ids=lambda p: p.stem)
async def test_turns_under_a_timer_continue_here_only_if_they_never_started_it(
    path: Path,
) -> None:
    failure = await replay(path)
    assert (failure is None) is not started_a_timer(path)
    if failure is not None:
        assert isinstance(failure, NondeterminismError)
        assert "TimerStarted" in str(failure)


@pytest.mark.parametrize("path", BEFORE_MEMO, ids=lambda p: p.stem)
async def test_turns_that_waited_before_the_memo_listed_their_calls_stay_on_their_version(
    path: Path,
) -> None:
    failure = await replay(path)
    assert isinstance(failure, NondeterminismError)
    assert "ModifyWorkflowProperties" in str(failure), failure


def test_every_local_activity_of_a_turn_fails_one_way_live_and_in_replay() -> None:
    """The turn calls its local activities through `_local` only, which raises a timeout
    as the same error whether the activity ran or is replayed from its marker (the SDK
    raises `ActivityError` in the first case, the bare `TimeoutError` in the second)."""
    source = (Path(__file__).parent.parent / "workflows" / "turn.py").read_text()
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and node.attr
        in {
            "execute_local_activity_method",
            "execute_local_activity",
            "start_local_activity_method",
            "start_local_activity",
        }
    ]
    assert len(calls) == 1, "call local activities through `_local` (workflows/turn.py)"


def test_the_workflows_ask_no_patch() -> None:
    """Turns and conversations are pinned to the version they started on, so a change
    needs no `workflow.patched`; and a patch asked halfway through a turn is answered by
    the workflow task a replay meets it in (a worker that took the turn over met the
    `consent-per-call` marker where its replay made another command, and the turn
    stuck). Histories of code that asked are kept in `histories/markers/`."""
    folder = Path(__file__).parent.parent / "workflows"
    for source in sorted(folder.glob("*.py")):
        asked = [
            node.attr
            for node in ast.walk(ast.parse(source.read_text()))
            if isinstance(node, ast.Attribute) and node.attr in {"patched", "deprecate_patch"}
        ]
        assert not asked, f"{source.name} asks {asked}: the workflows are pinned (docs/deploy.md)"
