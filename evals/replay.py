"""An earlier run's episodes asked of another model, tools answered from the record.

    python -m durable_agent.evals replay tau2-retail-c24c739e --model openai:gpt-4o-mini

The run is found by its id in the state folder it ran from (`AGENT_STATE_DIR`): its
records say which episodes finished, and each episode's turn is read back from its
Temporal history. Each episode is then replayed (`AgentClient.replay`, the per-turn
replay of `client.py replay`) with the new model, in a world of its own:

- while the model's calls repeat the recording's (same tool, same arguments, in
  order), each is answered with its recorded result, and nothing runs;
- from the first call that differs, the episode runs live, on a fresh copy of its
  database: the domain's initial one, with the recorded calls the replay was answered
  from taken as its own first (`EpisodeStore.record` and `follow`), so the copy is
  where the recording was when the two parted. Writes need consent as in any run,
  approved as the customer would. The recorded run's database is never touched.

Each episode is scored by the benchmark's own evaluator, as a run's are, and reported
with where it left the recording (`rewind.compare`) and what the record saved. The
replay is a run of its own (`replay-<hash>` of the recorded run, the model and the
state folder), whose records and databases live in its own SQLite file: the same
command again takes the episodes it finished as they were and follows the ones under
way (each replay has a workflow id of the run's naming, `<episode>-<replay>`).

Replays of an oracle run's episodes (one turn each) only: a real model's run is made of
conversations with the benchmark's customer, which are refused in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import re
import sqlite3
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from temporalio.client import Client

from durable_agent import rewind
from durable_agent.client import AgentClient
from durable_agent.errors import AgentClientError, UnknownTurn
from durable_agent.evals import tau2
from durable_agent.evals.report import Progress, draw_table
from durable_agent.evals.run import (
    Consent,
    Records,
    Scoring,
    _close_scorer,
    _score,
    approved_as_customer,
    oracle_models,
    store_tools,
    worker_for,
)
from durable_agent.model import ModelCatalog
from durable_agent.runtime.rewind import recording
from durable_agent.types import StepKind, TurnOutput

PREFIX = "replay-"


class ReplayError(AgentClientError):
    """A replay that cannot be done, in one line: an unknown run, a model the worker
    lacks or cannot use, a run of conversations."""


@dataclass
class ReplayReport:
    task: str
    workflow_id: str
    """The replay's turn."""
    original: str
    """The recorded episode's turn."""
    passed: bool
    reward: float
    db_match: bool | None
    store_matches_gold: bool
    writes: int
    expected_writes: int
    diverged_at: int | None
    """The step where its calls first differ from the recording's; None: nowhere."""
    recorded_tool_calls: int
    saved_tool_calls: int
    """The recording's calls it was answered from: none of them ran."""
    live_tool_calls: int
    """The calls it ran, live, on its own copy of the episode's database."""
    model_calls: int
    """The new model's calls: it decides every step itself."""
    saved_model_calls: int
    """Model calls the record answered for. An oracle run's episode is one turn with no
    customer to ask, so every model call is the new model's own: none are saved."""
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    seconds: float
    outcome: str
    link: str
    from_earlier: bool = False
    """Taken as an earlier invocation of the replay recorded it."""


@dataclass
class RecordedRun:
    """An earlier run, as its records have it: its domain and its finished episodes
    (task id, the episode's workflow id), in the domain's order of tasks."""

    run: str
    domain: str
    path: Path
    episodes: list[tuple[str, str]]


def replay_id(run: str, model: str, state_dir: Path) -> str:
    """`replay-<hash>` of the recorded run, the model and the state folder."""
    what = [run, model, str(state_dir.resolve())]
    return PREFIX + hashlib.sha256(json.dumps(what).encode()).hexdigest()[:8]


def recorded_run(run: str, state_dir: Path) -> RecordedRun:
    """The run `run` of the state folder `state_dir`; ReplayError saying what to give
    when there is none, or it is not one that can be replayed."""
    runs = sorted(
        p.stem for p in state_dir.glob("tau2-*.db") if re.fullmatch(r"tau2-.+-[0-9a-f]{8}", p.stem)
    )
    if run.startswith(PREFIX):
        raise ReplayError(f"{run} is a replay: replay the run it replayed")
    found = re.fullmatch(r"tau2-(.+)-[0-9a-f]{8}", run)
    path = state_dir / f"{run}.db"
    if found is None or not path.exists():
        known = f"runs here: {', '.join(runs)}" if runs else "no run has been made here yet"
        raise ReplayError(
            f"no eval run {run!r} in {state_dir} (AGENT_STATE_DIR): give the id of a run "
            f"made with this state folder, its report's name ({known})"
        )
    with contextlib.closing(sqlite3.connect(path)) as db:
        try:
            reports = [json.loads(r) for (r,) in db.execute("SELECT report FROM finished")]
        except sqlite3.OperationalError:
            reports = []
    if not reports:
        raise ReplayError(f"run {run} has no finished episode to replay: run it to its end first")
    if any(r.get("termination") for r in reports):
        raise ReplayError(
            f"run {run} is a real model's: its episodes are conversations with the "
            "benchmark's customer; replays take an oracle run's (one turn each)"
        )
    domain = found[1]
    order = {t.id: n for n, t in enumerate(tau2.tasks(domain))}
    episodes = sorted(
        ((str(r["task"]), str(r["workflow_id"])) for r in reports),
        key=lambda e: order.get(e[0], len(order)),
    )
    return RecordedRun(run, domain, path, episodes)


def models_for(domain: str, tasks: list[Any]) -> ModelCatalog:
    """What a replay's worker serves: the tasks' oracles and every backend."""
    from durable_agent.backends import default_models

    return oracle_models(domain, tasks, base=default_models())


def check_model(model: str, models: ModelCatalog) -> None:
    """The worker has `model`'s kind; ReplayError naming those it has otherwise."""
    kind = model.partition(":")[0]
    if not model or kind not in models.kinds:
        has = [k if k in ("oracle", "offline") else f"{k}:<model>" for k in models.kinds]
        raise ReplayError(
            f"--model {model!r}: the worker has no such model: give one of {', '.join(has)}"
        )


def prepared(
    run: str, model: str, state_dir: Path, models: ModelCatalog | None = None
) -> tuple[RecordedRun, list[Any], ModelCatalog]:
    """The run, its tasks and the models its replay's worker serves, once they are
    known to do (ReplayError otherwise): asked before anything starts."""
    recorded = recorded_run(run, state_dir)
    tasks = tau2.tasks(recorded.domain, [task for task, _ in recorded.episodes])
    models = models or models_for(recorded.domain, tasks)
    check_model(model, models)
    return recorded, tasks, models


async def replay_run(
    client: Client,
    run: str,
    model: str,
    *,
    state_dir: Path,
    models: ModelCatalog | None = None,
    concurrency: int = 4,
    ui_url: str = "",
    out: Any = sys.stdout,
) -> tuple[str, list[ReplayReport]]:
    """Every finished episode of the run `run` replayed with `model` (`oracle`: each
    task's own), `concurrency` at a time, on a worker of this process serving
    `models` (default: the oracles and every backend). The replay's id and its
    reports, in the run's order; ReplayError when it cannot be done."""
    recorded, tasks, models = prepared(run, model, state_dir, models)
    name = replay_id(run, model, state_dir)
    original = tau2.EpisodeStore(recorded.path, recorded.domain)
    store = tau2.EpisodeStore(state_dir / f"{name}.db", recorded.domain)
    records = Records(store.path)
    agents = AgentClient(client, task_queue=name, ui_url=ui_url)
    progress = Progress(len(tasks), out)
    scoring = Scoring(len(tasks))
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Any, episode: str, consent: Consent) -> ReplayReport:
        ended = scoring.turn()
        try:
            async with gate:
                replayed = await _replayed(
                    agents, task, episode, name, model, original, store, records, consent
                )
        finally:
            ended()
        if isinstance(replayed, ReplayReport):
            progress.scored(replayed.passed)
            progress.turn_done(f"task {task.id:>4}", "finished in an earlier run")
            return replayed
        c = replayed.comparison
        where = f"diverged at step {c.diverged_at}" if c.diverged_at else "followed the recording"
        progress.turn_done(
            f"task {task.id:>4}",
            f"replay {replayed.seconds:.1f} s, {where}; {c.served} of {c.recorded} tool calls "
            "from the record",
        )
        scored = await scoring.run(_score, recorded.domain, task.id, str(store.path), episode)
        link = agents.turn_url(replayed.workflow_id)
        report = _report(task, episode, replayed, scored, store, link)
        records.finish(replayed.workflow_id, asdict(report))
        progress.scored(report.passed)
        return report

    episodes = dict(recorded.episodes)
    try:
        async with (
            worker_for(client, recorded.domain, tasks, store, name, models=models),
            Consent(client, name) as consent,
        ):
            running = [asyncio.ensure_future(one(t, episodes[t.id], consent)) for t in tasks]
            try:
                reports = await asyncio.gather(*running)
            except BaseException:
                # One that cannot be done (its model refused) ends the replay: the
                # others stop with it, before their worker does.
                for episode in running:
                    episode.cancel()
                await asyncio.gather(*running, return_exceptions=True)
                raise
    finally:
        progress.close()
        _close_scorer()
    print(table(reports), file=out, flush=True)
    return name, list(reports)


@dataclass
class Replayed:
    """An episode's replay, ended, before it is scored."""

    workflow_id: str
    output: TurnOutput
    comparison: rewind.Comparison
    seconds: float


async def _replayed(
    agents: AgentClient,
    task: Any,
    episode: str,
    name: str,
    model: str,
    original: tau2.EpisodeStore,
    store: tau2.EpisodeStore,
    records: Records,
    consent: Consent,
) -> Replayed | ReplayReport:
    """The episode's replay to its end (a report when an earlier invocation finished
    it), its database caught up with what the record answered."""
    client = agents.temporal
    try:
        recorded = await recording(client, episode)
    except UnknownTurn:
        raise ReplayError(
            f"episode {episode} is not on this Temporal server: replay the run against "
            "the server it ran on (TEMPORAL_ADDRESS, or the state folder's own)"
        ) from None
    store.record(episode, _calls(recorded, original, episode))
    spec = f"oracle:{task.id}" if model == "oracle" else model
    for n in itertools.count(1):
        wid = f"{episode}-{name}" + (f"-{n}" if n > 1 else "")
        kept = records.finished(wid)
        if kept is not None:
            return replace(ReplayReport(**kept), from_earlier=True)
        started = time.monotonic()
        turn = await agents.replay(episode, model=spec, own_world=True, replay_id=wid)
        if consent.watching:
            output = TurnOutput.model_validate(await turn.temporal.result())
        else:
            output = await approved_as_customer(turn)
        seconds = round(time.monotonic() - started, 2)
        if (refused := rewind.refused_model(output)) is None:
            break
        if turn.started:
            raise ReplayError(f"replay {wid}: its model cannot be used: {refused}")
        # Refused in an earlier invocation (its model's settings since changed?): a
        # replay of its own, next to it; the refused one made no call.
    comparison = rewind.compare(recorded.output.steps, output.steps)
    # A replay that never ran a call live (it followed the recording to its end, or
    # answered early) has not been caught up yet: the database takes what it was served.
    store.follow(episode, comparison.served)
    return Replayed(wid, output, comparison, seconds)


def _report(
    task: Any,
    episode: str,
    replayed: Replayed,
    scored: dict[str, Any],
    store: tau2.EpisodeStore,
    link: str | None,
) -> ReplayReport:
    c, output = replayed.comparison, replayed.output
    writes_of = store_tools(store)
    usage = output.usage
    return ReplayReport(
        task=task.id,
        workflow_id=replayed.workflow_id,
        original=episode,
        passed=scored["reward"] == 1.0 and scored["store_matches_gold"],
        reward=scored["reward"],
        db_match=scored["db_match"],
        store_matches_gold=scored["store_matches_gold"],
        writes=scored["writes"],
        expected_writes=sum(writes_of.get(tool, False) for tool, _ in tau2.expected_actions(task)),
        diverged_at=c.diverged_at,
        recorded_tool_calls=c.recorded,
        saved_tool_calls=c.served,
        live_tool_calls=sum(s.kind is StepKind.TOOL_CALL and bool(s.calls) for s in output.steps),
        model_calls=usage.model_calls,
        saved_model_calls=0,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost_usd=usage.cost_usd,
        seconds=replayed.seconds,
        outcome=output.outcome.value,
        link=link or "",
    )


def _calls(
    recorded: rewind.Recording, original: tau2.EpisodeStore, episode: str
) -> list[tuple[str, dict[str, Any], str, bool]]:
    """The recording's calls in the order a replay is answered from them, each with the
    result the episode's database gave it (the raw text the benchmark scores; the text
    the model read when the database has no such call) and whether it writes."""
    writes_of = store_tools(original)
    kept = original.keyed_calls(episode)
    used: set[int] = set()
    calls: list[tuple[str, dict[str, Any], str, bool]] = []
    for r in rewind.recorded_calls(recorded):
        tool, arguments = r.call.name, r.call.arguments
        found = next(
            (
                n
                for n, (key, name, args, _) in enumerate(kept)
                if n not in used
                and name == tool
                and args == arguments
                and key.rsplit("/", 2)[-2] == str(r.step)
            ),
            None,
        )
        if found is not None:
            used.add(found)
        result = kept[found][3] if found is not None else (r.text or "")
        calls.append((tool, arguments, result, writes_of.get(tool, False)))
    return calls


COLUMNS = (
    ("task", "<"),
    ("pass", "<"),
    ("reward", ">"),
    ("diverged", ">"),
    ("tool calls saved", ">"),
    ("run live", ">"),
    ("model calls", ">"),
    ("model calls saved", ">"),
    ("wall s", ">"),
    ("link", "<"),
)


def table(reports: list[ReplayReport]) -> str:
    """Per episode: pass, reward, where it left the recording (`nowhere`: it never did),
    the recorded tool calls it was answered from and those it ran live, the new model's
    calls and those the record saved, its wall time and its link in the Web UI."""
    rows = [
        [
            r.task,
            "pass" if r.passed else "FAIL",
            f"{r.reward:.2f}",
            "nowhere" if r.diverged_at is None else f"step {r.diverged_at}",
            f"{r.saved_tool_calls}/{r.recorded_tool_calls}",
            str(r.live_tool_calls),
            str(r.model_calls),
            str(r.saved_model_calls),
            f"{r.seconds:.1f}",
            r.link or "-",
        ]
        for r in reports
    ]
    return draw_table(COLUMNS, rows)


def totals(reports: list[ReplayReport]) -> dict[str, Any]:
    costs = [r.cost_usd for r in reports if r.cost_usd is not None]
    diverged = [r.diverged_at for r in reports if r.diverged_at is not None]
    return {
        "episodes": len(reports),
        "passed": sum(r.passed for r in reports),
        "reward": round(sum(r.reward for r in reports) / max(len(reports), 1), 4),
        "diverged": len(diverged),
        "recorded_tool_calls": sum(r.recorded_tool_calls for r in reports),
        "saved_tool_calls": sum(r.saved_tool_calls for r in reports),
        "live_tool_calls": sum(r.live_tool_calls for r in reports),
        "model_calls": sum(r.model_calls for r in reports),
        "saved_model_calls": sum(r.saved_model_calls for r in reports),
        "input_tokens": sum(r.input_tokens for r in reports),
        "output_tokens": sum(r.output_tokens for r in reports),
        "cost_usd": round(sum(costs), 6) if costs else None,
        "seconds": round(sum(r.seconds for r in reports), 1),
    }


def summary(total: dict[str, Any]) -> str:
    """The total in one line (its report's paths follow it)."""
    return (
        f"{total['passed']}/{total['episodes']} passed, mean reward {total['reward']:.2f}; "
        f"diverged in {total['diverged']} of {total['episodes']} episode(s); "
        f"{total['saved_tool_calls']} of {total['recorded_tool_calls']} recorded tool calls "
        f"answered from the record, {total['live_tool_calls']} run live; "
        f"{total['model_calls']} model calls, {total['saved_model_calls']} saved"
    )
