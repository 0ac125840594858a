"""A τ²-bench run: every task an episode, each a durable turn of the domain's agent.

The run has an id made of what it runs (domain, model, tasks) and where its records
live (the state folder), and each episode a workflow id made of the run's and the
task's: running the same command again
(after the client, the worker or the server died) finds the episodes already
finished and takes them as they are, follows the ones still running, and starts
only the rest. The episodes' databases live in one SQLite file per run
(`EpisodeStore`), where each write is applied once whatever is retried.

An episode gives its consent to writes as the customer would: each call waiting
for approval is approved by `evals:customer`, on the record like any decision.

What the runner learns of an episode is kept in the run's SQLite file too
(`Records`): the wall time of its turn as the turn ends, and its report once
scored. A run started again takes both as they are, so a rerun or a resumed run
reports each episode's time as it was when it ran.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import csv
import hashlib
import json
import logging
import multiprocessing
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowQueryFailedError
from temporalio.service import RPCError

from durable_agent.client import AgentClient, TurnHandle
from durable_agent.errors import AgentClientError
from durable_agent.evals import tau2
from durable_agent.evals.report import Progress, table
from durable_agent.model import ModelCatalog
from durable_agent.runtime.turns import decide, made_by, memo_pending
from durable_agent.settings import Settings
from durable_agent.types import TurnInput, TurnOutput
from durable_agent.workflows import search

APPROVER = "evals:customer"
log = logging.getLogger("evals")


@dataclass
class EpisodeReport:
    task: str
    workflow_id: str
    passed: bool
    reward: float
    db_match: bool | None
    store_matches_gold: bool
    writes: int
    expected_writes: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    seconds: float
    history_events: int
    history_bytes: int
    outcome: str
    link: str
    ended_s: float = 0.0
    """When its turn ended, in seconds from the start of the invocation it ended in."""
    timed_whole: bool = True
    """Its `seconds` were measured by one runner from its start to its end. False: its
    turn was under way when the run was stopped, and its time (the workflow's own,
    from the server) includes the stop."""
    from_earlier: bool = False
    """Taken as an earlier invocation of the run recorded it (a rerun, a resumed run)."""
    trial: int = 0
    termination: str = ""
    """How a conversation ended, in the benchmark's words (`user_stop`, `max_steps`…)."""
    turns: int = 1
    customer_calls: int = 0
    """The user simulator's model calls (real models only), and their tokens and cost."""
    customer_input_tokens: int = 0
    customer_output_tokens: int = 0
    customer_cost_usd: float = 0.0


def run_id(
    domain: str,
    model: str,
    task_ids: list[str],
    chaos: bool = False,
    *,
    user_model: str = "",
    trials: int = 1,
    state_dir: Path | None = None,
) -> str:
    """The run's id: what it runs (with a real model, who plays the customer and how
    many trials too), whether under chaos (a run of its own), and where its records
    live (`state_dir`): a run in another state folder is another run, never one that
    takes the episodes an earlier one finished elsewhere as its own."""
    what: list[Any] = [domain, model, task_ids] + (["chaos"] if chaos else [])
    if user_model:
        what += [user_model, trials]
    if state_dir is not None:
        what.append(str(state_dir.resolve()))
    digest = hashlib.sha256(json.dumps(what).encode()).hexdigest()
    return f"tau2-{domain}-{digest[:8]}"


def episode_id(run: str, task_id: str, trial: int | None = None) -> str:
    """`<run>-<task>` (`-<trial>` with trials), at most 64 characters: a customer id."""
    suffix = "" if trial is None else f"-{trial}"
    return f"{run}-{re.sub(r'[^A-Za-z0-9_.@-]', '_', task_id)}"[: 64 - len(suffix)] + suffix


def question_of(task: Any) -> str:
    scenario = task.user_scenario
    instructions = getattr(scenario, "instructions", scenario)
    return str(instructions)[:4000] or f"Task {task.id}"


def oracle_models(domain: str, tasks: list[Any], base: ModelCatalog | None = None) -> ModelCatalog:
    """`oracle:<task id>`, each task's oracle (and `base`'s models, when given)."""
    by_id = {t.id: t for t in tasks}

    def oracle(task_id: str) -> Any:
        task = by_id.get(task_id)
        if task is None:
            raise tau2.EvalSetupError(f"oracle:{task_id}: no such task in this run")
        return tau2.OracleModel(tau2.expected_actions(task))

    return ModelCatalog({"oracle": oracle}, default="oracle", base=base)


async def _turn(
    client: Client,
    task: Any,
    run: str,
    task_queue: str,
    agent: str,
    consent: Consent | None = None,
) -> tuple[TurnOutput, Any, bool]:
    """The task's turn, started unless an earlier run did, approved as the customer
    would (by `consent`, else on its own), to its end; and whether this call started
    it."""
    workflow_id = episode_id(run, task.id)
    turn = TurnInput(
        question=question_of(task),
        customer_id=workflow_id,
        agent=agent,
        model=f"oracle:{task.id}",
    )
    # Started by an earlier run (running, or finished), it is that one.
    started = await AgentClient(client, task_queue=task_queue).start_turn(
        turn, workflow_id=workflow_id
    )
    if consent is not None and consent.watching:
        output = TurnOutput.model_validate(await started.temporal.result())
    else:
        output = await approved_as_customer(started)
    # Made by this call, not found running (an earlier invocation's, killed mid-run):
    # only then is the whole turn timed here.
    return output, started.temporal, made_by(started.temporal)


class Consent:
    """Consent as the customer, for every turn of a task queue that waits for it: one
    query of the server's visibility every `INTERVAL` finds the turns waiting,
    whatever the concurrency (not one describe per running turn), and each call that
    waits is approved by `APPROVER`, on the record. A namespace without the turns'
    search attributes cannot be asked so: then each turn is watched on its own
    (`approved_as_customer`; `watching` is False)."""

    INTERVAL = 0.05

    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.query = (
            f"TaskQueue = '{task_queue}' AND ExecutionStatus = 'Running' AND "
            f"{search.STATUS.name} = '{search.AWAITING_APPROVAL}'"
        )
        self.watching = False
        self._poller: asyncio.Task[None] | None = None
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._decided: dict[str, set[str]] = {}
        """Turn → the calls approved: a turn listed again with nothing else waiting is
        the server's visibility not having caught up with the decision yet."""

    async def __aenter__(self) -> Consent:
        try:
            async for _ in self.client.list_workflows(self.query, limit=1):
                break
            self.watching = True
        except RPCError as e:  # e.g. AgentStatus is not a search attribute here
            log.info("consent: %s; each turn is watched on its own", e)
        if self.watching:
            self._poller = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = [t for t in (self._poller, *self._asking.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            try:
                async for found in self.client.list_workflows(self.query):
                    if found.id not in self._asking:
                        self._asking[found.id] = asyncio.create_task(self._approve(found))
            except RPCError as e:
                log.info("consent: %s; asking again", e)
            await asyncio.sleep(self.INTERVAL)

    async def _approve(self, found: WorkflowExecution) -> None:
        """Approve the calls the turn `found` waits for: those its memo lists, as the
        listing showed it (no worker is asked), else those the turn says."""
        workflow_id = found.id
        try:
            decided = self._decided.setdefault(workflow_id, set())
            listed = [p.call.id for p in await memo_pending(found.memo_value)]
            seen: WorkflowExecution | None = found
            if not listed:
                turn = AgentClient(self.client).turn(workflow_id)
                listed = [w.call.id for w in (await turn.progress(timeout=30)).pending]
                seen = None
            for call_id in listed:
                if call_id not in decided:
                    await decide(
                        self.client, workflow_id, call_id, approved=True, by=APPROVER, seen=seen
                    )
                    decided.add(call_id)
        except (AgentClientError, RPCError, WorkflowQueryFailedError) as e:
            # A workflow task that failed (it is retried), a busy worker: found again.
            log.info("turn %s: %s; asking again", workflow_id, e)
        finally:
            self._asking.pop(workflow_id, None)


class Records:
    """What a run keeps of its episodes, in its SQLite file: each turn's wall time as
    it ended, and each report once scored (a run started again takes them as they
    are: an episode's time is the one it had when it ran). A run asks it from a
    thread: its writes never hold up the worker's event loop, where other turns run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS turn_times (episode TEXT PRIMARY KEY,"
                " seconds REAL, whole INTEGER, ended_s REAL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS finished (episode TEXT PRIMARY KEY, report TEXT)"
            )

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def timed(self, episode: str) -> tuple[float, bool, float] | None:
        """(seconds, measured whole, ended_s) of its turn, if recorded."""
        with contextlib.closing(self._db()) as db:
            row = db.execute(
                "SELECT seconds, whole, ended_s FROM turn_times WHERE episode = ?", (episode,)
            ).fetchone()
        return None if row is None else (float(row[0]), bool(row[1]), float(row[2]))

    def time(self, episode: str, seconds: float, whole: bool, ended_s: float) -> None:
        """The first record of an episode's time is the one kept."""
        with contextlib.closing(self._db()) as db:
            db.execute(
                "INSERT OR IGNORE INTO turn_times VALUES (?, ?, ?, ?)",
                (episode, seconds, int(whole), ended_s),
            )

    def finished(self, episode: str) -> dict[str, Any] | None:
        with contextlib.closing(self._db()) as db:
            row = db.execute("SELECT report FROM finished WHERE episode = ?", (episode,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def finish(self, episode: str, report: dict[str, Any]) -> None:
        with contextlib.closing(self._db()) as db:
            db.execute(
                "INSERT OR REPLACE INTO finished VALUES (?, ?)", (episode, json.dumps(report))
            )


async def _workflow_seconds(handle: Any) -> float:
    """A finished workflow's own wall time, from the server's clock."""
    described = await handle.describe()
    if described.close_time is None:
        return 0.0
    return float((described.close_time - described.start_time).total_seconds())


async def approved_as_customer(turn: TurnHandle) -> TurnOutput:
    """The turn's result, each of its calls awaiting consent approved by `APPROVER`."""
    handle = turn.temporal
    result = asyncio.ensure_future(handle.result())
    try:
        while not result.done():
            try:
                # The turn's status is a search attribute and the calls awaiting consent
                # are in its memo: the server answers; the worker is asked (a query)
                # only on a namespace without the turn's attributes.
                described = await handle.describe()
                status = described.typed_search_attributes.get(search.STATUS)
                if status in (None, search.AWAITING_APPROVAL):
                    listed = [p.call.id for p in await memo_pending(described.memo_value)]
                    if not listed and status is None:
                        listed = [w.call.id for w in (await turn.progress(timeout=30)).pending]
                    for call_id in listed:
                        await turn.approve(call_id, by=APPROVER)
            except (AgentClientError, RPCError, WorkflowQueryFailedError) as e:
                # A workflow task that failed (it is retried), a busy worker: ask again.
                log.info("turn %s: %s; asking again", handle.id, e)
            await asyncio.wait([result], timeout=0.2)
        return TurnOutput.model_validate(result.result())
    finally:
        result.cancel()


async def episode(
    client: Client,
    domain: str,
    task: Any,
    run: str,
    task_queue: str,
    agent: str,
    store: tau2.EpisodeStore,
    ui_url: str,
    gate: asyncio.Semaphore | None = None,
    since: float | None = None,
    records: Records | None = None,
    progress: Progress | None = None,
    scoring: Scoring | None = None,
    consent: Consent | None = None,
) -> EpisodeReport:
    """One task's episode: its turn (holding a place of `gate` while it runs), then
    its score, which is not part of the turn's time. `since`: the run's start. With
    `records`, an episode an earlier invocation finished is taken as it was, and the
    turn's time is kept as it ends; `progress` moves when the turn ends; `consent`
    approves its calls (else it watches its turn on its own)."""
    scoring = scoring or Scoring(1)
    ended = scoring.turn()
    try:
        return await _episode(
            client,
            domain,
            task,
            run,
            task_queue,
            agent,
            store,
            ui_url,
            gate,
            since,
            records,
            progress,
            scoring,
            ended,
            consent,
        )
    finally:
        ended()


async def _episode(
    client: Client,
    domain: str,
    task: Any,
    run: str,
    task_queue: str,
    agent: str,
    store: tau2.EpisodeStore,
    ui_url: str,
    gate: asyncio.Semaphore | None,
    since: float | None,
    records: Records | None,
    progress: Progress | None,
    scoring: Scoring,
    ended: Callable[[], None],
    consent: Consent | None,
) -> EpisodeReport:
    workflow_id = episode_id(run, task.id)
    kept = await asyncio.to_thread(records.finished, workflow_id) if records is not None else None
    if kept is not None:
        report = replace(EpisodeReport(**kept), from_earlier=True)
        if progress is not None:
            progress.scored(report.passed)
            progress.turn_done(f"task {task.id:>4}", "finished in an earlier run")
        return report
    since = since if since is not None else time.monotonic()
    async with gate or contextlib.nullcontext():
        started = time.monotonic()
        output, handle, fresh = await _turn(client, task, run, task_queue, agent, consent)
        stopped = time.monotonic()
    ended()
    timed = await asyncio.to_thread(records.timed, workflow_id) if records is not None else None
    if timed is None:
        # Started here: timed here. Started by an earlier invocation: the workflow's
        # own time, which includes the stop.
        seconds = stopped - started if fresh else await _workflow_seconds(handle)
        timed = (round(seconds, 2), fresh, round(stopped - since, 2))
        if records is not None:
            await asyncio.to_thread(records.time, workflow_id, *timed)
    seconds, whole, ended_s = timed
    history = await handle.fetch_history()
    events = len(history.events)
    size = sum(e.ByteSize() for e in history.events)
    if progress is not None:
        progress.turn_done(
            f"task {task.id:>4}",
            f"turn {seconds:.1f} s{'' if whole else ' (resumed)'}, "
            f"{output.usage.model_calls} model calls, {events} events",
        )
    scored = await scoring.run(_score, domain, task.id, str(store.path), workflow_id)
    writes_of = store_tools(store)
    expected = sum(writes_of.get(tool, False) for tool, _ in tau2.expected_actions(task))
    report = EpisodeReport(
        task=task.id,
        workflow_id=workflow_id,
        passed=scored["reward"] == 1.0 and scored["store_matches_gold"],
        reward=scored["reward"],
        db_match=scored["db_match"],
        store_matches_gold=scored["store_matches_gold"],
        writes=scored["writes"],
        expected_writes=expected,
        model_calls=output.usage.model_calls,
        input_tokens=output.usage.input_tokens,
        output_tokens=output.usage.output_tokens,
        cost_usd=output.usage.cost_usd,
        seconds=seconds,
        history_events=events,
        history_bytes=size,
        outcome=output.outcome.value,
        link=f"{ui_url}/namespaces/{client.namespace}/workflows/{workflow_id}" if ui_url else "",
        ended_s=ended_s,
        timed_whole=whole,
    )
    if records is not None:
        await asyncio.to_thread(records.finish, workflow_id, asdict(report))
    if progress is not None:
        progress.scored(report.passed)
    return report


class Scoring:
    """Where episodes are scored, behind their turns (the benchmark's evaluator loads
    databases whole: in processes of their own, so the worker's workflow tasks in
    this one never wait for it). While turns run: one process at the lowest
    priority, one episode at a time, so the turns never wait for scoring. Once the
    last turn has ended, what still waits is scored by processes at normal priority
    too, one per core: there is nothing left to make wait, and on a busy machine a
    process at the lowest priority may hardly run at all (the one being scored there
    then is scored again at normal priority, its process stopped)."""

    def __init__(self, turns: int) -> None:
        self._turns = turns
        self._one = asyncio.Semaphore(1)
        self._hurry = asyncio.Event()
        if turns <= 0:
            self._hurry.set()
        self._cpu_from: float | None = None
        self.cpu_seconds: float | None = None
        """This process's CPU (every thread: the runner, a worker here, the tools) from
        the first turn's start to the last one's end; None until then. Steadier than
        wall time on a shared machine, and what the turns cost where they ran (its
        scoring is elsewhere)."""

    def turn(self) -> Callable[[], None]:
        """What to call when one turn (or plain loop) is over, however it ended (once;
        a second call does nothing). The first call starts the turns' window."""
        if self._cpu_from is None:
            self._cpu_from = time.process_time()
        over = False

        def ended() -> None:
            nonlocal over
            if not over:
                over = True
                self._turns -= 1
                if self._turns <= 0:
                    if self._cpu_from is not None and self.cpu_seconds is None:
                        self.cpu_seconds = round(time.process_time() - self._cpu_from, 2)
                    self._hurry.set()

        return ended

    async def run(self, fn: Any, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        if not self._hurry.is_set():
            slot = asyncio.ensure_future(self._one.acquire())
            hurry = asyncio.ensure_future(self._hurry.wait())
            try:
                await asyncio.wait({slot, hurry}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                hurry.cancel()
                slot.cancel()  # no-op once it has the slot
            if slot.done() and not slot.cancelled():
                try:
                    low = loop.run_in_executor(_scorer(low=True), fn, *args)
                    hurry = asyncio.ensure_future(self._hurry.wait())
                    try:
                        await asyncio.wait({low, hurry}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        hurry.cancel()
                    if low.done():
                        return low.result()
                    # The last turn ended while this episode was scored at the lowest
                    # priority, where a busy machine may leave it for minutes: that
                    # process is stopped (nothing is left to make wait; scoring changes
                    # nothing) and the episode is scored at normal priority.
                    low.add_done_callback(lambda f: f.cancelled() or f.exception())
                    _stop_scorer(low=True)
                finally:
                    self._one.release()
        return await loop.run_in_executor(_scorer(low=False), fn, *args)


_SCORERS: dict[bool, concurrent.futures.ProcessPoolExecutor] = {}


def _scorer(low: bool = True) -> concurrent.futures.ProcessPoolExecutor:
    """The scoring processes: one at the lowest priority (`low`), or one per core."""
    if low not in _SCORERS:
        # Spawned, not forked: this process runs Temporal's threads.
        spawn = multiprocessing.get_context("spawn")
        _SCORERS[low] = concurrent.futures.ProcessPoolExecutor(
            max_workers=1 if low else (os.cpu_count() or 2),
            mp_context=spawn,
            initializer=_exit_with,
            initargs=(os.getpid(), low),
        )
    return _SCORERS[low]


def _exit_with(parent: int, low: bool = True) -> None:
    """In a scoring process: end when the run's process is gone (even SIGKILLed).
    `low`: at the lowest priority, so that scoring waits for the turns, not they for it."""
    if low:
        os.nice(19)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _stop_scorer(low: bool) -> None:
    """The scoring processes of that priority stopped at once, whatever they were doing."""
    pool = _SCORERS.pop(low, None)
    if pool is None:
        return
    # The executor's own processes (3.14 names this `terminate_workers`).
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _close_scorer() -> None:
    while _SCORERS:
        _, pool = _SCORERS.popitem()
        pool.shutdown(cancel_futures=True)


def _score(domain: str, task_id: str, store_path: str, episode: str) -> dict[str, Any]:
    (task,) = tau2.tasks(domain, [task_id])
    return tau2.score(domain, task, tau2.EpisodeStore(Path(store_path), domain), episode)


_WRITES: dict[str, dict[str, bool]] = {}


def store_tools(store: tau2.EpisodeStore) -> dict[str, bool]:
    """The domain's tools: name → whether it writes."""
    if store.domain not in _WRITES:
        env = tau2.environment(store.domain)
        from tau2.environment.toolkit import ToolType

        _WRITES[store.domain] = {
            name: env.tools.tool_type(name) == ToolType.WRITE for name in env.tools.tools
        }
    return _WRITES[store.domain]


async def run_tasks(
    client: Client,
    domain: str,
    tasks: list[Any],
    *,
    state_dir: Path,
    concurrency: int = 8,
    ui_url: str = "",
    out: Any = sys.stdout,
    chaos: bool = False,
    serve_here: bool = True,
    scoring: Scoring | None = None,
) -> list[EpisodeReport]:
    """Every task as an episode, `concurrency` at a time, on a worker of this process
    (with `chaos`, on worker processes killed at random: `evals/chaos.py`; without
    `serve_here`, on workers started elsewhere: `python -m durable_agent.evals worker`).
    `scoring`: where the episodes are scored, made for these tasks (its `cpu_seconds`
    then says what the run cost this process)."""

    run = run_id(domain, "oracle", [t.id for t in tasks], chaos, state_dir=state_dir)
    store = tau2.EpisodeStore(state_dir / f"{run}.db", domain)
    records = Records(store.path)
    store_tools(store)  # the reports ask which tools write: found out before the turns run
    agent = tau2.domain_agent(domain, store, model_calls="local")  # the oracle answers at once
    task_queue = run
    gate = asyncio.Semaphore(concurrency)
    progress = Progress(len(tasks), out)
    scoring = scoring or Scoring(len(tasks))
    consent = Consent(client, task_queue)
    since = time.monotonic()

    async def one(task: Any) -> EpisodeReport:
        return await episode(
            client,
            domain,
            task,
            run,
            task_queue,
            agent.name,
            store,
            ui_url,
            gate,
            since,
            records=records,
            progress=progress,
            scoring=scoring,
            consent=consent,
        )

    async def all_of_them() -> list[EpisodeReport]:
        try:
            async with consent:
                return list(await asyncio.gather(*(one(t) for t in tasks)))
        finally:
            progress.close()
            _close_scorer()

    if chaos:
        from durable_agent.evals.chaos import WorkerPool

        pool = WorkerPool(domain, [t.id for t in tasks], store.path, task_queue)
        async with pool:
            reports = await pool.until_failed(all_of_them())
        print(table(reports), file=out, flush=True)
        print(f"chaos: {pool.kills} worker(s) SIGKILLed during the run", file=out, flush=True)
        return reports
    if not serve_here:
        reports = await all_of_them()
    else:
        async with worker_for(client, domain, tasks, store, task_queue, agent):
            reports = await all_of_them()
    print(table(reports), file=out, flush=True)
    return reports


def worker_for(
    client: Client,
    domain: str,
    tasks: list[Any],
    store: tau2.EpisodeStore,
    task_queue: str,
    agent: Any = None,
    models: ModelCatalog | None = None,
) -> Any:
    """A worker serving a run: the domain's agent over `store`, and `models` (by
    default the tasks' oracles)."""
    from durable_agent.commands.worker import build_worker

    settings = replace(Settings.from_env(), versioning=False, task_queue=task_queue)
    return build_worker(
        client,
        task_queue,
        agents=[agent or tau2.domain_agent(domain, store)],
        settings=settings,
        models=models or oracle_models(domain, tasks),
    )


async def serve(domain: str, task_ids: list[str], store_path: Path, task_queue: str) -> None:
    """A worker process of a chaos run (`python -m durable_agent.evals worker`), until SIGTERM."""
    import signal

    from durable_agent.evals.chaos import serving
    from durable_agent.runtime.server import connect

    conn = await connect()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    store = tau2.EpisodeStore(store_path, domain)
    agent = tau2.domain_agent(domain, store, model_calls="local")  # the oracle's, as run_tasks
    tasks = tau2.tasks(domain, task_ids)
    async with worker_for(conn.client, domain, tasks, store, task_queue, agent):
        serving()
        await stop.wait()


@dataclass
class Floor:
    """The plain loop's run: the time until its last episode's loop ended, each
    episode's own time (by task), and whether each passed; this process's CPU over
    that time (`Scoring.cpu_seconds`)."""

    seconds: float
    episodes: dict[str, float]
    passed: list[bool]
    cpu_seconds: float | None = None


async def plain_run(
    domain: str, tasks: list[Any], *, state_dir: Path, concurrency: int = 8
) -> Floor:
    """The floor: the same oracle episodes in a plain loop in this process, calling the
    same tools on a store of their own, with no Temporal, `concurrency` at a time as
    a durable run. Times leave scoring aside, as for durable runs; each episode is
    scored as the durable ones are."""
    from durable_agent.conversation import Message, ToolResult, UserMessage
    from durable_agent.model import ModelRequest
    from durable_agent.tools import ToolContext

    run = run_id(domain, "oracle", [t.id for t in tasks])
    path = state_dir / f"plain-{run}.db"
    for stale in state_dir.glob(f"plain-{run}.db*"):
        stale.unlink()
    store = tau2.EpisodeStore(path, domain)
    agent = tau2.domain_agent(domain, store)
    registry = agent.registry
    gate = asyncio.Semaphore(concurrency)

    ended: list[float] = []
    took: dict[str, float] = {}
    scoring = Scoring(len(tasks))

    async def one(task: Any) -> bool:
        over = scoring.turn()
        try:
            return await loop(task, over)
        finally:
            over()

    async def loop(task: Any, over: Callable[[], None]) -> bool:
        async with gate:
            began = time.monotonic()
            name = episode_id(run, task.id)
            model = tau2.OracleModel(tau2.expected_actions(task))
            messages: list[Message] = [UserMessage(text=question_of(task))]
            for step in range(agent.limits.max_steps):
                request = ModelRequest(
                    messages=messages, tools=registry.specs, instructions=agent.system_prompt
                )
                reply = await model.plan(request)
                if not reply.calls:
                    break
                messages.append(reply.message())
                for i, call in enumerate(reply.calls):
                    args = registry.validate(call)
                    ctx = ToolContext(name, store, f"{name}/{step}/{i}")
                    text = await asyncio.to_thread(registry[call.name].fn, args, ctx)
                    messages.append(ToolResult(call_id=call.id, tool=call.name, ok=True, text=text))
            ended.append(time.monotonic())
            took[task.id] = round(ended[-1] - began, 3)
        over()
        scored = await scoring.run(_score, domain, task.id, str(path), name)
        return bool(scored["reward"] == 1.0 and scored["store_matches_gold"])

    started = time.monotonic()
    try:
        passed = await asyncio.gather(*(one(t) for t in tasks))
    finally:
        _close_scorer()
    return Floor(max(ended, default=started) - started, took, list(passed), scoring.cpu_seconds)


def against_floor(
    reports: list[EpisodeReport], floor: dict[str, Any], cpu_seconds: float | None = None
) -> dict[str, Any]:
    """The durable run's time over the plain loop's (`--plain`, same tasks, same
    concurrency), over the episodes both timed whole: the sum of their turns' times
    over the sum of the loop's. Each episode's time is the one it had when it ran, so
    a rerun or a resumed run gives the same ratio. When every episode ran whole in
    this invocation, also the run's wall time (until its last turn ended) over the
    loop's, and, given the run's `cpu_seconds` (`Scoring.cpu_seconds`, its worker in
    this process), its CPU over the floor's."""
    episodes: dict[str, float] = floor.get("episodes") or {}
    both = [r for r in reports if r.timed_whole and r.task in episodes]
    found: dict[str, Any] = {"floor_seconds": floor["seconds"], "over_floor_episodes": len(both)}
    if both:
        floor_sum = sum(episodes[r.task] for r in both)
        found["over_floor"] = round(sum(r.seconds for r in both) / max(floor_sum, 1e-9), 2)
    if len(both) == len(reports) == len(episodes) and not any(r.from_earlier for r in reports):
        wall = max(r.ended_s for r in reports)
        found["over_floor_wall"] = round(wall / max(floor["seconds"], 1e-9), 2)
        if cpu_seconds and floor.get("cpu_seconds"):
            found["over_floor_cpu"] = round(cpu_seconds / floor["cpu_seconds"], 2)
    return found


def write_reports(
    reports: list[Any], path: Path, total: dict[str, Any] | None = None
) -> tuple[Path, Path]:
    """Reports (dataclasses, one per episode) and their total, as JSON and CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    as_json, as_csv = path.with_suffix(".json"), path.with_suffix(".csv")
    rows = [asdict(r) for r in reports]
    summary = total if total is not None else totals(reports)
    as_json.write_text(json.dumps({"episodes": rows, "total": summary}, indent=2))
    with as_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["task"])
        writer.writeheader()
        writer.writerows(rows)
    return as_json, as_csv


def totals(reports: list[EpisodeReport]) -> dict[str, Any]:
    costs = [r.cost_usd for r in reports if r.cost_usd is not None]
    return {
        "episodes": len(reports),
        "passed": sum(r.passed for r in reports),
        "reward": round(sum(r.reward for r in reports) / max(len(reports), 1), 4),
        "model_calls": sum(r.model_calls for r in reports),
        "input_tokens": sum(r.input_tokens for r in reports),
        "output_tokens": sum(r.output_tokens for r in reports),
        "cost_usd": round(sum(costs), 6) if costs else None,
        "customer_calls": sum(r.customer_calls for r in reports),
        "customer_input_tokens": sum(r.customer_input_tokens for r in reports),
        "customer_output_tokens": sum(r.customer_output_tokens for r in reports),
        "customer_cost_usd": round(sum(r.customer_cost_usd for r in reports), 6),
        "longest_history_events": max((r.history_events for r in reports), default=0),
        "longest_history_bytes": max((r.history_bytes for r in reports), default=0),
        "seconds": round(sum(r.seconds for r in reports), 1),
    }
