"""A τ²-bench run with a real model: every task a durable conversation of the domain's
agent with the benchmark's own customer.

    run_conversations(client, "retail", tasks, model="openai:gpt-4o", trials=2, ...)

Each episode (a task and a trial) is a `Conversation` workflow whose id is the
episode's, and its customer id too (the tools' database is the episode's). The
customer is τ²-bench's `UserSimulator` (`evals/customer.py`): it answers the
orchestrator's greeting, then each of the agent's answers, until it says it is done
(###STOP###, ###TRANSFER### after the agent's transfer tool, ###OUT-OF-SCOPE###) or
the dialogue reaches the orchestrator's cap of steps. Each line is one turn of the
conversation (`<episode>-<n>`), its writes approved as the customer would
(`evals.run.approved_as_customer`). Then the benchmark scores it: the dialogue, the
calls the agent made and their results (the `EpisodeStore`'s log) as its
`SimulationRun`, through its `evaluate_simulation`, by the task's reward basis.

Running the same command again takes each episode up where it is: a finished one
(its report is kept) as it is; an unfinished one by walking its dialogue again,
reading the customer's recorded lines instead of asking the simulator, and the
agent's answers from its turns (finished turns are not run again; running ones go
on). A line is sent only if the conversation has not received it (its own count of
messages), and with an id made of the episode and the line's number, so a line
whose sending was cut by a crash is not received twice.

The conversation hands each turn the questions and answers before it (its memory,
set here to keep the whole dialogue), not the tool results of earlier turns: the
agent looks again what it needs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.chat import ConversationInput, Memory
from durable_agent.client import AgentClient
from durable_agent.evals import tau2
from durable_agent.evals.customer import Customer, CustomerLog, Line
from durable_agent.evals.report import Progress, table
from durable_agent.evals.run import (
    EpisodeReport,
    Scoring,
    _close_scorer,
    approved_as_customer,
    episode_id,
    run_id,
    store_tools,
    totals,
    worker_for,
)
from durable_agent.types import TurnOutput
from durable_agent.workflows import Conversation

MEMORY = Memory(max_exchanges=100, max_chars=100_000)
"""The whole dialogue, as the benchmark's agent would have it (up to the most a
conversation keeps)."""
IDLE_TIMEOUT = timedelta(days=7)
"""A run stopped and started again days later still finds its conversations."""


@dataclass
class Dialogue:
    """An episode's conversation as walked: what the customer said, the turns that
    answered, and how it ended (`TerminationReason` values)."""

    lines: list[Line] = field(default_factory=list)
    outputs: list[TurnOutput] = field(default_factory=list)
    turn_ids: list[str] = field(default_factory=list)
    termination: str = ""


def trial_seeds(trials: int) -> list[int]:
    """Each trial's seed for the customer's model, drawn as the benchmark's runner
    draws them (`tau2.run.run_tasks`: from its default seed)."""
    from tau2.config import DEFAULT_SEED

    draw = random.Random(DEFAULT_SEED)
    return [draw.randint(0, 1000000) for _ in range(trials)]


async def converse(
    client: Client,
    episode: str,
    customer: Customer,
    store: tau2.EpisodeStore,
    *,
    agent: str,
    model: str,
    task_queue: str,
    max_steps: int,
) -> Dialogue:
    """The episode's dialogue, from its start or from where a run before stopped."""
    conversation = client.get_workflow_handle(episode)
    received = await _received(conversation)
    if received > len(customer.log.lines(episode)):
        raise tau2.EvalSetupError(
            f"conversation {episode} on the server has lines this run's records "
            f"({customer.log.path}) do not: run it with the state directory it started "
            "with (AGENT_STATE_DIR)"
        )
    dialogue = Dialogue()
    agent_said = tau2.FIRST_AGENT_MESSAGE
    turn = 0
    while True:
        line = await customer.answer(turn, agent_said)
        dialogue.lines.append(line)
        if line.stop:
            dialogue.termination = "user_stop"
            break
        if not line.text:  # the benchmark's own check of a user message refuses it too
            dialogue.termination = "user_error"
            break
        if turn >= received:
            await _deliver(client, conversation, episode, turn, line.text, agent, model, task_queue)
        turn_id = f"{episode}-{turn + 1}"
        await _started(client, turn_id)
        output = await approved_as_customer(AgentClient(client).turn(turn_id))
        dialogue.turn_ids.append(turn_id)
        dialogue.outputs.append(output)
        if not output.answer.strip():
            dialogue.termination = "agent_error"
            break
        if _steps(dialogue, store.keyed_calls(episode)) >= max_steps:
            dialogue.termination = "max_steps"
            break
        agent_said = output.answer
        turn += 1
    with contextlib.suppress(RPCError):  # it has ended already (a run before ended it)
        await conversation.signal(Conversation.end)
    return dialogue


async def _received(conversation: WorkflowHandle) -> int:
    """How many messages the conversation has received (0: it is not there yet)."""
    try:
        state = await conversation.query(Conversation.state)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return 0
        raise
    return int(state.turns)


async def _started(client: Client, turn_id: str) -> None:
    """Until the turn exists: a line the conversation received before a crash may
    still wait in its inbox for the turn before it to end."""
    while True:
        try:
            await client.get_workflow_handle(turn_id).describe()
            return
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise
        await asyncio.sleep(0.2)


async def _deliver(
    client: Client,
    conversation: WorkflowHandle,
    episode: str,
    turn: int,
    text: str,
    agent: str,
    model: str,
    task_queue: str,
) -> None:
    """Send line `turn`; the first starts the conversation. The message id is the
    line's own: sent again after a crash, it is received once."""
    message_id = f"{episode}/line/{turn}"
    agents = AgentClient(client, task_queue=task_queue)
    if turn == 0:
        chat = ConversationInput(
            customer_id=episode,
            agent=agent,
            model=model,
            memory=MEMORY,
            idle_timeout=IDLE_TIMEOUT,
        )
        started = agents.chat_from(chat, conversation_id=episode)
        await started.start(text, message_id=message_id)
    else:
        await agents.conversation(conversation.id).start(text, message_id=message_id)


def _steps(dialogue: Dialogue, calls: list[tuple[str, str, dict[str, Any], str]]) -> int:
    """Steps so far as the benchmark's orchestrator counts them: each message, and
    each step's tool calls and their results (one step each)."""
    call_steps = {key.rsplit("/", 1)[0] for key, *_ in calls}
    return len(dialogue.lines) + len(dialogue.outputs) + 2 * len(call_steps)


@dataclass(frozen=True)
class RealRun:
    """What a real-model run runs, beyond its tasks."""

    domain: str
    model: str
    user_model: str
    trials: int = 1

    def id(self, task_ids: list[str], state_dir: Path) -> str:
        """The run's id. Its records (the customer's lines, the episodes' databases)
        live in `state_dir`: another directory is another run, never one that finds
        conversations on the server it has no record of."""
        return run_id(
            self.domain,
            self.model,
            task_ids,
            user_model=f"{self.user_model} {state_dir.resolve()}",
            trials=self.trials,
        )


async def conversation_episode(
    client: Client,
    run: RealRun,
    task: Any,
    trial: int,
    seed: int,
    *,
    run_name: str,
    store: tau2.EpisodeStore,
    log: CustomerLog,
    agent: str,
    ui_url: str = "",
    gate: asyncio.Semaphore | None = None,
    since: float | None = None,
    progress: Progress | None = None,
    scoring: Scoring | None = None,
) -> EpisodeReport:
    """One trial of a task: its conversation to its end, then its score (outside the
    time of its turns). A finished episode's report is the one kept. `progress`
    moves when the conversation ends."""
    scoring = scoring or Scoring(1)
    ended = scoring.turn()
    try:
        return await _conversation_episode(
            client,
            run,
            task,
            trial,
            seed,
            run_name,
            store,
            log,
            agent,
            ui_url,
            gate,
            since,
            progress,
            scoring,
            ended,
        )
    finally:
        ended()


async def _conversation_episode(
    client: Client,
    run: RealRun,
    task: Any,
    trial: int,
    seed: int,
    run_name: str,
    store: tau2.EpisodeStore,
    log: CustomerLog,
    agent: str,
    ui_url: str,
    gate: asyncio.Semaphore | None,
    since: float | None,
    progress: Progress | None,
    scoring: Scoring,
    over: Callable[[], None],
) -> EpisodeReport:
    episode = episode_id(run_name, task.id, trial)
    kept = log.finished(episode)
    if kept is not None:
        report = replace(EpisodeReport(**kept), from_earlier=True)
        if progress is not None:
            progress.scored(report.passed)
            progress.turn_done(f"task {task.id:>4} trial {trial}", "finished in an earlier run")
        return report
    from tau2.config import DEFAULT_MAX_STEPS

    llm, llm_args = tau2.customer_llm(run.user_model)
    customer = Customer(task, llm, {**llm_args, "seed": seed}, log, episode)
    async with gate or contextlib.nullcontext():
        started = time.monotonic()
        dialogue = await converse(
            client,
            episode,
            customer,
            store,
            agent=agent,
            model=run.model,
            task_queue=run_name,
            max_steps=DEFAULT_MAX_STEPS,
        )
        ended = time.monotonic()
    over()
    if progress is not None:
        progress.turn_done(
            f"task {task.id:>4} trial {trial}",
            f"{len(dialogue.outputs)} turns ({dialogue.termination}), {ended - started:.1f} s",
        )
    simulation = tau2.simulation(
        task,
        episode,
        [line.text for line in dialogue.lines],
        [output.answer for output in dialogue.outputs],
        store.keyed_calls(episode),
        dialogue.termination,
    )
    scored = await scoring.run(
        _score, run.domain, task.id, str(store.path), episode, simulation.model_dump_json()
    )
    events, size = await _longest_turn(client, dialogue.turn_ids)
    usage = [output.usage for output in dialogue.outputs]
    costs = [u.cost_usd for u in usage if u.cost_usd is not None]
    from tau2.metrics.agent_metrics import is_successful

    report = EpisodeReport(
        task=task.id,
        workflow_id=episode,
        passed=is_successful(scored["reward"]),
        reward=scored["reward"],
        db_match=scored["db_match"],
        store_matches_gold=scored["store_matches_gold"],
        writes=scored["writes"],
        expected_writes=sum(
            store_tools(store).get(tool, False) for tool, _ in tau2.expected_actions(task)
        ),
        model_calls=sum(u.model_calls for u in usage),
        input_tokens=sum(u.input_tokens for u in usage),
        output_tokens=sum(u.output_tokens for u in usage),
        cost_usd=round(sum(costs), 6) if costs else None,
        seconds=round(ended - started, 2),
        history_events=events,
        history_bytes=size,
        outcome=dialogue.outputs[-1].outcome.value if dialogue.outputs else "",
        link=f"{ui_url}/namespaces/{client.namespace}/workflows/{episode}" if ui_url else "",
        ended_s=round(ended - (since if since is not None else started), 2),
        trial=trial,
        termination=dialogue.termination,
        turns=len(dialogue.outputs),
        customer_calls=len(dialogue.lines),
        customer_input_tokens=sum(line.input_tokens for line in dialogue.lines),
        customer_output_tokens=sum(line.output_tokens for line in dialogue.lines),
        customer_cost_usd=round(sum(line.cost_usd for line in dialogue.lines), 6),
    )
    log.finish(episode, asdict(report))
    if progress is not None:
        progress.scored(report.passed)
    return report


def _score(
    domain: str, task_id: str, store_path: str, episode: str, simulation_json: str
) -> dict[str, Any]:
    """In the scoring process: the benchmark loads databases whole."""
    (task,) = tau2.tasks(domain, [task_id])
    store = tau2.EpisodeStore(Path(store_path), domain)
    return tau2.score_conversation(domain, task, store, episode, simulation_json)


async def _longest_turn(client: Client, turn_ids: list[str]) -> tuple[int, int]:
    """History events and bytes of the episode's longest turn."""
    longest = (0, 0)
    for turn_id in turn_ids:
        history = await client.get_workflow_handle(turn_id).fetch_history()
        size = (len(history.events), sum(e.ByteSize() for e in history.events))
        longest = max(longest, size)
    return longest


async def run_conversations(
    client: Client,
    run: RealRun,
    tasks: list[Any],
    *,
    state_dir: Path,
    concurrency: int = 4,
    ui_url: str = "",
    out: Any = sys.stdout,
) -> list[EpisodeReport]:
    """Every task `run.trials` times as a conversation, `concurrency` episodes at a
    time, on a worker of this process serving the agent with the project's models."""
    from durable_agent.backends import default_models

    name = run.id([t.id for t in tasks], state_dir)
    store = tau2.EpisodeStore(state_dir / f"{name}.db", run.domain)
    log = CustomerLog(store.path)
    agent = tau2.domain_agent(run.domain, store)
    gate = asyncio.Semaphore(concurrency)
    seeds = trial_seeds(run.trials)
    progress = Progress(len(tasks) * run.trials, out)
    scoring = Scoring(len(tasks) * run.trials)
    since = time.monotonic()

    async def one(task: Any, trial: int) -> EpisodeReport:
        return await conversation_episode(
            client,
            run,
            task,
            trial,
            seeds[trial],
            run_name=name,
            store=store,
            log=log,
            agent=agent.name,
            ui_url=ui_url,
            gate=gate,
            since=since,
            progress=progress,
            scoring=scoring,
        )

    models = default_models(default=run.model)
    async with worker_for(client, run.domain, tasks, store, name, agent, models):
        try:
            ordered = await asyncio.gather(
                *(one(task, trial) for task in tasks for trial in range(run.trials))
            )
        finally:
            progress.close()
            _close_scorer()
    print(table(ordered), file=out, flush=True)
    return list(ordered)


def pass_hat_k(reports: list[EpisodeReport], trials: int) -> dict[str, Any]:
    """Per task, its trials' passes and pass^k; for the run, pass^k for each k up to
    the trials, the mean over tasks, as the benchmark computes it."""
    from tau2.metrics.agent_metrics import pass_hat_k as benchmark_pass_hat_k

    by_task: dict[str, list[bool]] = {}
    for r in reports:
        by_task.setdefault(r.task, []).append(r.passed)
    per_task = {
        task: {
            "trials": len(passed),
            "passes": sum(passed),
            **{
                f"pass^{k}": benchmark_pass_hat_k(len(passed), sum(passed), k)
                for k in range(1, trials + 1)
            },
        }
        for task, passed in by_task.items()
    }
    run_wide = {
        f"pass^{k}": round(sum(t[f"pass^{k}"] for t in per_task.values()) / len(per_task), 4)
        for k in range(1, trials + 1)
    }
    return {"per_task": per_task, **run_wide}


def real_totals(reports: list[EpisodeReport], trials: int) -> dict[str, Any]:
    return {**totals(reports), **(pass_hat_k(reports, trials) if reports else {})}


INSTALL_HINTS = {
    "openai": ("openai", "openai"),
    "anthropic": ("anthropic", "anthropic"),
    "bedrock": ("boto3", "aws"),
}
"""Model kinds whose backend is an optional extra: (module, extra)."""


def check_agent_model(model: str, scripted: str = "oracle") -> None:
    """`model` is one the worker has (`scripted` names the run's own models, for the
    message), its backend installed; EvalSetupError saying what to give otherwise."""
    from durable_agent.backends import default_models

    kinds = default_models().kinds
    kind, _, name = model.partition(":")
    if kind not in kinds or (kind != "offline" and not name):
        raise tau2.EvalSetupError(
            f"--model {model!r}: give {scripted}, or a model the worker has: "
            + ", ".join(f"{k}:<model>" if k != "offline" else k for k in kinds)
        )
    _installed(model)


def _installed(spec: str) -> None:
    import importlib.util

    module, extra = INSTALL_HINTS.get(spec.partition(":")[0], ("", ""))
    if module and importlib.util.find_spec(module) is None:
        raise tau2.EvalSetupError(
            f"{spec!r} needs the `{module}` package: pip install -e '.[{extra}]'"
        )


def check_models(model: str, user_model: str) -> None:
    """The agent's model is one the worker has, its backend installed, and the
    customer's is one LiteLLM can play; EvalSetupError saying what to give otherwise."""
    check_agent_model(model)
    _installed(user_model)
    tau2.customer_llm(user_model)
    from durable_agent.evals.customer import check_installed

    check_installed()
