"""Recorded turns as a gate: the project's own replay gate (tests/test_replay.py), for
your agent.

    await record_turn(turn, HISTORIES, "vpn_status")       # once; commit the files
    await check_replays(HISTORIES, agent)                    # in every test run

A turn that is running when a worker of new code takes it over (a deployment, a crash)
is replayed on that code: its workflow must make the same decisions from the same
history, or the turn is stuck. `check_replays` replays each recorded history on the
code installed now — durable-agent's workflows, run as a worker of `agents` runs them,
with your worker's own `plugins` — and fails with one line per history that does not
replay, or whose agent none of `agents` is.

What your agent's definition changes (instructions, tools, models) never breaks a
replay: a turn records what it got from the agent as it went. What does: another
release of durable-agent whose workflows decide differently, a plugin or interceptor of
your worker that changes what a workflow does, and an agent renamed or removed while
its turns run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.worker import Plugin, Replayer

from durable_agent.agents import Agent
from durable_agent.chat import ConversationInput
from durable_agent.client import ConversationHandle, TurnHandle
from durable_agent.plugin import AgentPlugin
from durable_agent.runtime import storage, turns
from durable_agent.settings import Settings
from durable_agent.testing._errors import ReplayFailed
from durable_agent.types import TurnInput

SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
WRAPPED = re.compile(r'message: "((?:[^"\\]|\\.)*)"')
"""The message of a failure the SDK's core wraps in its own text."""


async def record_turn(
    turn: TurnHandle | ConversationHandle, folder: str | Path, name: str = ""
) -> list[Path]:
    """Write the turn's history to `folder/<name>.json` (default name: its workflow id),
    with its workflow id beside it (`<name>.id`: a replay needs it). A turn that
    continued as new is written run by run (`<name>.run1.json`, ...). Returns the
    history files written."""
    name = name or turn.id
    if not SAFE_NAME.fullmatch(name):
        raise ValueError(f"name {name!r}: use 1-100 letters, digits, '_', '.' or '-'")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = turn.client.temporal.get_workflow_handle(turn.id)
    chain = await turns.runs(handle) if isinstance(turn, TurnHandle) else []
    run_ids: list[str | None] = [run_id for run_id, _ in chain] if len(chain) > 1 else [None]
    written = []
    for n, run_id in enumerate(run_ids, 1):
        run = turn.client.temporal.get_workflow_handle(turn.id, run_id=run_id)
        history = await run.fetch_history()
        # Stored payloads written into the history: it replays anywhere, with no store.
        await storage.inline_stored(turn.client.temporal, turn.id, history.events)
        stem = f"{name}.run{n}" if run_id else name
        (folder / f"{stem}.json").write_text(history.to_json())
        (folder / f"{stem}.id").write_text(turn.id + "\n")
        written.append(folder / f"{stem}.json")
    return written


async def check_replays(
    folder: str | Path,
    agent: Agent,
    *more: Agent,
    plugins: Sequence[Plugin] = (),
    settings: Settings | None = None,
) -> list[Path]:
    """Replay every history recorded in `folder` (`*.json`) on the current code, as a
    worker serving `agent` and `more` with `plugins` runs them. `ReplayFailed` names
    each one that does not replay, one line each; a folder with none fails too (a gate
    that checks nothing passes nothing). Returns the histories replayed."""
    paths = sorted(Path(folder).glob("*.json"))
    if not paths:
        raise ReplayFailed(
            f"{folder}: no recorded turns (*.json); record some with record_turn(turn, folder)"
        )
    # The sandbox, as the project's own gate replays: stricter than a deployed worker.
    checked = replace(settings or Settings(), versioning=False, workflow_sandbox=True)
    plugin = AgentPlugin(agent, *more, settings=checked)
    # A replay runs no activity: the agents' deps (a database, a client) stay closed.
    plugin.run_context = None
    replayer = Replayer(workflows=[], plugins=[plugin, *plugins])
    names = plugin.agents.names
    failures = []
    for path in paths:
        problem = await _replayed(replayer, path, names)
        if problem:
            failures.append(f"{path.name}: {problem}")
    if failures:
        raise ReplayFailed(
            f"{len(failures)} of {len(paths)} recorded turns in {folder} cannot continue on "
            "this code:\n" + "\n".join(failures)
        )
    return paths


async def _replayed(replayer: Replayer, path: Path, served: list[str]) -> str:
    """Why the history at `path` does not replay on `replayer` (empty: it does)."""
    id_file = path.with_suffix(".id")
    workflow_id = id_file.read_text().strip() if id_file.exists() else f"replay-{path.stem}"
    try:
        history = WorkflowHistory.from_json(workflow_id, path.read_text())
    except Exception as e:  # not JSON, or not a history
        return f"not a workflow history ({_line(e)})"
    agent = await _agent_of(replayer, history)
    if agent and agent not in served:
        return (
            f"its agent {agent!r} is not among the agents given ({', '.join(served)}); a "
            "worker of this code would end it unknown_agent"
        )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is not None:
        return f"{type(result.replay_failure).__name__}: {_line(result.replay_failure)}"
    return ""


async def _agent_of(replayer: Replayer, history: WorkflowHistory) -> str:
    """The agent the recorded turn or conversation names (empty: the worker's first)."""
    if not history.events:
        return ""
    started = history.events[0].workflow_execution_started_event_attributes
    kind: type[Any] = {"AgentTurn": TurnInput, "Conversation": ConversationInput}.get(
        started.workflow_type.name, type(None)
    )
    if kind is type(None) or not started.input.payloads:
        return ""
    converter = replayer.config(active_config=True)["data_converter"]
    try:
        [given] = await converter.decode(list(started.input.payloads), [kind])
    except Exception:  # an input this code cannot read: the replay says what is wrong
        return ""
    return str(getattr(given, "agent", "") or "")


def _line(error: BaseException, limit: int = 300) -> str:
    """An error's message in one line, within `limit` characters: the failure's own
    message where the SDK wraps it (`Failure { failure: Some(Failure { message: "…"`)."""
    text = str(error).strip()
    inner = WRAPPED.search(text)
    text = inner.group(1) if inner else (text.splitlines()[0] if text else type(error).__name__)
    return text if len(text) <= limit else text[: limit - 1] + "…"
