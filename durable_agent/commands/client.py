"""Ask an agent; every question runs as one durable Temporal workflow.

python client.py ask "Has order 123456 shipped?" [--agent NAME] [--customer ID] [--follow]
python client.py ask "..." --set temperature=0.2 --set stop=END   # the turn's model settings
python client.py ask "What does it say about refunds?" --attach terms.pdf   # a file with it
python client.py ask "Weather?" --secret api_key=...   # a secret context value (or NAME: from env)
python client.py chat [--agent NAME] [--customer ID] [--model SPEC]   # Ctrl-D ends it
                                                   # (a line `/attach PATH`: a file with the next)
python client.py pending [--customer ID]                  # calls awaiting approval, questions
python client.py approve WORKFLOW_ID [CALL_ID] [--by NAME] [--tenant T --user U --role R]
python client.py answer WORKFLOW_ID [QUESTION_ID] (--accept JSON | --decline | --cancel)
python client.py reject WORKFLOW_ID [CALL_ID] [--reason TEXT] [--by NAME]
python client.py wake WORKFLOW_ID [--by NAME]           # end a turn's waits early
python client.py event WORKFLOW_ID NAME JSON [--by NAME] # an event a turn waits for
python client.py list [--agent NAME] [--customer ID] [--outcome O] [--awaiting-approval]
python client.py list --tenant T [--user U]              # the turns a tenant's users asked
python client.py audit [--tenant T] [--user U] [--since 7d] [--limit N] [--json]   # decisions
python client.py show WORKFLOW_ID
python client.py schedule add NAME --agent A (--cron EXPR | --every 1h | --at TIME) "QUESTION"
python client.py schedule list | show NAME | pause NAME | resume NAME | trigger NAME | delete NAME
python client.py memory list | export --customer ID [--tenant T]   # a customer's memories
python client.py memory forget MEMORY_ID --customer ID [--tenant T] [--erase-turn [--conversation]]
python client.py erase --turn WORKFLOW_ID [--conversation]   # delete a turn and its payloads
python client.py rerun WORKFLOW_ID --from-step N [--model SPEC] [--instructions FILE]
python client.py rerun WORKFLOW_ID --from-step N --current   # on the agent as served now
python client.py replay WORKFLOW_ID --model SPEC   # the turn asked again, tools from the record
python client.py versions       # the worker deployment's versions, and what needs each
python client.py move-conversations   # idle conversations onto the current version now
python client.py server         # a Temporal server alone (for rollouts; Ctrl-C stops it)
python client.py demo           # the six sample questions, no setup needed
python client.py web [--agent NAME] [--port 8080] [--customer ID]   # the web chat, on loopback

`--tenant`, `--user` and `--role` (of `ask`, `approve`, `reject`) name who asks or decides
(`durable_agent.Principal`). They are trusted only for local use: the command takes
whoever runs it at their word. A service takes them from its own authentication.

`--agent` names the agent that answers (default: the worker's first), or gives its
definition as MODULE:ATTRIBUTE: then a command that starts a worker of its own (`web`,
`demo`, `--embedded`) serves that agent, and the web chat speaks in its words. Such a
worker connects the MCP servers the agent's definition names, and those of
`--mcp-config FILE` (docs/mcp.md), as `python worker.py` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import math
import os
import re
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import to_jsonable_python
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from durable_agent import mcp, model_settings, telemetry
from durable_agent.agents import AGENT_NAME_PATTERN, Agent
from durable_agent.approval import ApprovalDecision
from durable_agent.audit import MAX_AUDIT_TURNS
from durable_agent.chat import ConversationInput
from durable_agent.client import MAX_CONTEXT_DEPTH, AgentClient, TurnHandle, checked_context
from durable_agent.commands.questions import answer_question
from durable_agent.context_sources import cited
from durable_agent.elicitation import Action
from durable_agent.errors import AgentDefinitionError, InvalidContext, MemoryUnavailable
from durable_agent.memory import MemoryAccess
from durable_agent.memory import cli as memory_cli
from durable_agent.model_settings import ModelSettings
from durable_agent.pricing import usage_line
from durable_agent.principal import DEFAULT_TENANT, Principal
from durable_agent.rewind import Comparison, Origin, refused_model
from durable_agent.rewind import compare as rewind_compare
from durable_agent.runtime import deployments, rewind, search
from durable_agent.runtime.cli import (
    OneLineParser,
    model_spec,
    number_of,
    port_number,
    task_queue_name,
    whole_number,
)
from durable_agent.runtime.server import (
    LOCAL_HOST,
    LOCAL_PORT,
    LOCAL_UI_PORT,
    Connection,
    EmbeddedServer,
    ServerUnavailable,
    connect,
    free_port,
    is_listening,
    serve_alone,
)
from durable_agent.runtime.settings import TASK_QUEUE, client_command, worker_command
from durable_agent.runtime.turns import (
    AgentClientError,
    WorkerNeeded,
    Workers,
    history_view,
    started_with,
    workers,
)
from durable_agent.schedules import NAME_PATTERN
from durable_agent.schedules import cli as schedules_cli
from durable_agent.secret import SECRETS_KEY
from durable_agent.serving import load
from durable_agent.settings import Settings, state_dir
from durable_agent.stream import DoneEvent, Drafts, StepEvent, TokensEvent
from durable_agent.types import (
    DEFAULT_CUSTOMER,
    Outcome,
    Step,
    StepKind,
    TurnInput,
    TurnLimits,
    TurnOutput,
    check_customer_id,
)
from durable_agent.waits import Woke, WorldEvent, checked_event
from durable_agent.workflows import search as keys

__all__ = ["main", "run"]

DEMO_QUESTIONS = [
    "Which item was ordered for 123456?",
    "When is my return rtn003 processed?",
    "How is the weather in Scotland right now?",
    "Which item was ordered for 383833?",
    "When is my return rtn123 processed?",
    "What is the impact of return rtn001 on world peace?",
]

# Where each input field comes from on the command line, for error messages.
FLAGS = {
    "question": "QUESTION",
    "customer_id": "--customer",
    "agent": "--agent",
    "model": "--model",
    "max_steps": "--max-steps",
    "max_duration": "--max-duration",
    "max_tokens": "--max-tokens",
    "max_cost": "--max-cost",
    "context": "--context",
    "settings": "--set",
    "approval_timeout": "--approval-timeout",
    "idle_timeout": "--idle-timeout",
}


class CliError(Exception):
    """An error shown to the user as one line, with a non-zero exit."""


EXIT_NOT_ANSWERED = 3
"""A turn that ended without a real answer (its model failed, no worker serves its agent,
or it hit a cap): the answer says why; scripts can tell it from a good one."""

UNANSWERED = (
    Outcome.MODEL_ERROR,
    Outcome.UNKNOWN_AGENT,
    Outcome.STEP_LIMIT,
    Outcome.TIME_LIMIT,
    Outcome.TOKEN_LIMIT,
    Outcome.INVALID_OUTPUT,
    Outcome.COST_LIMIT,
    Outcome.BUDGET_LIMIT,
    Outcome.PAYLOAD_UNAVAILABLE,
)


@dataclass(frozen=True)
class Chosen:
    """The agent a command talks to: the name its turns carry (empty: the worker's
    first), and its definition when this process knows it (to speak in its words, and
    to serve it when the command starts a worker of its own)."""

    name: str
    definition: Agent | None


def client_of(conn: Connection, args: argparse.Namespace) -> AgentClient:
    """The public client on the command's connection and task queue: the commands ask,
    follow and decide as any application does."""
    return AgentClient(conn.client, task_queue=args.task_queue, ui_url=conn.ui_url)


def choose_agent(value: str) -> Chosen:
    """`--agent`: a served name, or MODULE:ATTRIBUTE (the definition, loaded here).
    A name is looked up among the definitions AGENT_AGENTS names (and the demo's). None
    given: the worker's first, whichever it is (a worker this command starts serves the
    ones AGENT_AGENTS names, else the demo's)."""
    value = value.strip()
    if ":" in value:
        try:
            (agent,) = load([value])
        except AgentDefinitionError as e:
            raise CliError(str(e)) from None
        return Chosen(agent.name, agent)
    if value and not re.fullmatch(AGENT_NAME_PATTERN, value):
        raise CliError(
            f"--agent {value!r}: give an agent's name (letters, digits, '_', '.', '-') or "
            "its definition as MODULE:ATTRIBUTE"
        )
    try:
        known = default_agents()
    except AgentDefinitionError as e:
        raise CliError(str(e)) from None
    if not value:
        return Chosen("", None)
    return Chosen(value, next((a for a in known if a.name == value), None))


def default_agents() -> list[Agent]:
    """What a worker started with no --agent serves: AGENT_AGENTS, else the demo's."""
    from durable_agent.commands.worker import agents_of

    return agents_of(Settings.from_env().agents, "AGENT_AGENTS")


@contextlib.asynccontextmanager
async def session(
    task_queue: str,
    *,
    self_contained: bool,
    needs_worker: bool = True,
    agent: Chosen | None = None,
    mcp_config: str = "",
) -> AsyncIterator[Connection]:
    """A connection; with `self_contained`, also an embedded server and an in-process
    worker for `agent` when no live one serves the queue, so the command works on a
    fresh machine: it connects the MCP servers of the agent's definition and of
    `mcp_config` first, as `worker.py` does. Else a note when no live worker serves
    the queue and the command `needs_worker`."""
    # A bad file is one line before anything connects.
    servers = mcp_servers(mcp_config) if self_contained else []
    conn = await connect(start_embedded=self_contained)
    if conn.server:
        print(
            f"started this folder's Temporal server on {conn.server.address} (Web UI "
            f"{conn.ui_url}); it stops when this command ends",
            file=sys.stderr,
            flush=True,
        )
    for note in conn.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    try:
        if not (self_contained or needs_worker):
            yield conn
            return
        serving = await workers(conn.client, task_queue)
        if self_contained and not serving.live:
            chosen = agent or choose_agent("")
            if chosen.name and chosen.definition is None:
                raise CliError(
                    f"no live worker serves task queue {task_queue!r}, and agent "
                    f"{chosen.name!r} is not one this process knows: start "
                    f"`{worker_command()} --agent MODULE:ATTRIBUTE{queue_flag(task_queue)}`, "
                    "or give --agent MODULE:ATTRIBUTE"
                )
            # The agent it names, and nothing else; none named: the worker's defaults.
            named = [chosen.definition] if chosen.definition else default_agents()
            async with own_worker(conn.client, task_queue, named, servers) as served:
                conn.served = served
                yield conn
        else:
            if not serving.live:
                print(f"note: {no_worker(task_queue, serving)}", file=sys.stderr)
            elif mcp_config:
                print(
                    f"note: --mcp-config {mcp_config} is not used: a live worker serves task "
                    f"queue {task_queue!r} with the MCP servers it was started with",
                    file=sys.stderr,
                )
            yield conn
    finally:
        await conn.aclose([task_queue])


def mcp_config(args: argparse.Namespace) -> str:
    """`--mcp-config`, which only a command that starts its own worker reads."""
    if args.mcp_config and not args.embedded:
        raise CliError(
            "--mcp-config is read by the worker that --embedded starts: add --embedded, "
            "or give it to the worker (`durable-agent-worker --mcp-config FILE`)"
        )
    return str(args.mcp_config or "")


def mcp_servers(path: str) -> list[mcp.MCPServer]:
    """The servers of `--mcp-config` (none: no file); a bad file is a CliError."""
    try:
        return mcp.load_config(path) if path else []
    except mcp.MCPConfigError as e:
        raise CliError(str(e)) from None


@contextlib.asynccontextmanager
async def own_worker(
    client: Client, task_queue: str, agents: list[Agent], servers: list[mcp.MCPServer]
) -> AsyncIterator[list[Agent]]:
    """A worker of this process for `agents` (yielded as served), their MCP servers (and
    `servers`) connected for as long as it runs. A server that cannot start, or a
    definition that cannot be served, is a CliError before the command does anything."""
    from durable_agent.commands.worker import build_worker

    async with contextlib.AsyncExitStack() as stack:
        try:
            served = await stack.enter_async_context(mcp.connected(agents, servers))
            await stack.enter_async_context(build_worker(client, task_queue, agents=served))
        except AgentDefinitionError as e:
            raise CliError(str(e)) from None
        yield served


def no_worker(task_queue: str, serving: Workers) -> str:
    seen = (
        f"the last one was seen {ago(serving.last_seen)} ago"
        if serving.last_seen
        else "none has been seen"
    )
    return (
        f"no live worker serves task queue {task_queue!r} ({seen}); the turn waits until "
        f"you start `{worker_command()}{queue_flag(task_queue)}` (or use --embedded)"
    )


def queue_flag(task_queue: str) -> str:
    """` --task-queue X` when a command needs it to reach `task_queue`."""
    return "" if task_queue == TASK_QUEUE else f" --task-queue {task_queue}"


def ago(when: datetime) -> str:
    seconds = int((datetime.now(timezone.utc) - when).total_seconds())
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


def input_error(e: ValidationError) -> CliError:
    """A validation error naming the flag or argument at fault."""
    parts = []
    for err in e.errors():
        field = next((str(p) for p in reversed(err["loc"]) if str(p) in FLAGS), "")
        message = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{FLAGS[field]}: {message}" if field else message)
    return CliError("; ".join(parts))


def customer_filter(args: argparse.Namespace) -> str | None:
    """`--customer` of `pending` and `list`, checked as turns check it."""
    if args.customer is None:
        return None
    try:
        return check_customer_id(args.customer)
    except ValueError as e:
        raise CliError(f"--customer: {e}") from None


MAX_SECONDS = 365 * 24 * 3600.0
"""No duration flag goes beyond a year (Temporal's timers would take more; a person's
typo should not)."""


def duration(flag: str, value: float, unit: str = "seconds") -> timedelta:
    """A duration flag's value, checked before anything is built from it."""
    per = 60.0 if unit == "minutes" else 1.0
    if not math.isfinite(value):
        raise CliError(f"{flag}: give a number of {unit}, not {value!r}")
    if not 0 < value * per <= MAX_SECONDS:
        raise CliError(
            f"{flag}: give more than 0 and at most {MAX_SECONDS / per:g} {unit} (a year)"
        )
    return timedelta(seconds=value * per)


def context_of(args: argparse.Namespace) -> dict[str, object]:
    """`--context JSON`: the turn's context, a JSON object (checked as the client checks
    it: `InvalidContext`)."""
    if args.context is None:
        return {}
    try:
        given = json.loads(args.context)
    except json.JSONDecodeError as e:
        example = '{"plan": "pro"}'
        raise CliError(f"--context: give a JSON object, e.g. '{example}' ({e})") from None
    except RecursionError:
        raise CliError(
            f"--context: the context nests lists and objects over {MAX_CONTEXT_DEPTH} deep: "
            "give it flatter"
        ) from None
    try:
        return checked_context(given)
    except InvalidContext as e:
        raise CliError(f"--context: {e}") from None


def secrets_of(args: argparse.Namespace) -> dict[str, str]:
    """`--secret NAME=VALUE` (or `NAME` alone: the environment variable NAME's value,
    which stays out of the process list and the shell's history): context values the
    turn gets as secrets (`AgentClient.start(secret=...)`). One line, before anything
    starts, for a name given twice, one `--context` has too, or an unset variable."""
    given = context_of(args)
    secrets: dict[str, str] = {}
    for pair in args.secret or []:
        name, has_value, value = pair.partition("=")
        name = name.strip()
        if not name:
            raise CliError("--secret: give NAME=VALUE, or NAME (an environment variable)")
        if name in secrets or name in given or name == SECRETS_KEY:
            raise CliError(f"--secret {name}: that context key is given already: name it once")
        if not has_value:
            if name not in os.environ:
                raise CliError(
                    f"--secret {name}: no environment variable {name}: set it, or give {name}=VALUE"
                )
            value = os.environ[name]
        secrets[name] = value
    return secrets


def settings_of(args: argparse.Namespace) -> ModelSettings | None:
    """`--set KEY=VALUE ...`: the turn's model settings (`model_settings.from_pairs`)."""
    try:
        return model_settings.from_pairs(args.settings)
    except ValueError as e:
        raise CliError(f"--set: {e}") from None


def limits(args: argparse.Namespace) -> TurnLimits | None:
    """The limits the flags set; None when none is given (the agent's apply)."""
    given = {
        "max_steps": args.max_steps,
        "max_duration": None
        if args.max_duration is None
        else duration("--max-duration", args.max_duration),
        "max_tokens": args.max_tokens,
        "max_cost": args.max_cost,
        "approval_timeout": None
        if args.approval_timeout is None
        else duration("--approval-timeout", args.approval_timeout),
    }
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return None
    try:
        return TurnLimits(**given)
    except ValidationError as e:
        raise input_error(e) from None


MAX_LISTED = 10_000
"""`list --limit`: turns listed at most."""
MAX_WORKFLOW_ID = 1000
"""Temporal's own limit on a workflow id's length."""


def workflow_id(value: str) -> str:
    """A workflow id as the commands take it: not empty, no spaces or control characters."""
    value = value.strip()
    if not value:
        raise CliError("WORKFLOW_ID: give a turn's workflow id (see `list` or `pending`)")
    if len(value) > MAX_WORKFLOW_ID or not value.isprintable() or any(c.isspace() for c in value):
        raise CliError(
            f"WORKFLOW_ID: {value[:60]!r} is not a workflow id (at most {MAX_WORKFLOW_ID} "
            "printable characters, no spaces)"
        )
    return value


async def print_result(
    conn: Connection, turn: TurnHandle, result: TurnOutput, *, sizes: bool = False
) -> int:
    """Print a finished turn (with `sizes`, what it costs the server and the store); its
    exit code (EXIT_NOT_ANSWERED when it was not answered)."""
    if result.output is not None:  # a typed turn's value: its JSON, to read or to pipe
        # An object where this process has the agent's type (its module loaded: --agent).
        value = json.dumps(to_jsonable_python(result.output), indent=2)
        print(f"\noutput ({result.outcome.value}):\n{value}")
    else:
        print(f"\nanswer ({result.outcome.value}): {result.answer}")
        for passage, where in cited(result.answer, result.steps):
            print(f"  cited [{passage}]: {where}")
    print(usage_line(result.usage))
    if result.agent:
        # No fingerprint: no worker serves an agent of that name.
        known = f"fingerprint {result.fingerprint}" if result.fingerprint else "not served here"
        print(f"agent: {result.agent} ({known})")
    if version := await turn.version():
        print(f"version: {version}")
    url = conn.workflow_url(turn.id, turn.temporal.result_run_id)
    print(f"workflow: {turn.id}" + (f"  {url}" if url else ""))
    if sizes:
        await print_size(turn)
    return EXIT_NOT_ANSWERED if result.outcome in UNANSWERED else 0


async def print_size(turn: TurnHandle) -> None:
    """`history: … in N runs (… events); payload store: … (…)`. The steps are printed
    already: a size that cannot be had is a note on stderr, never the command's error."""
    try:
        print((await turn.size()).line())
    except AgentClientError as e:
        print(f"note: no size: {e}", file=sys.stderr)


def decide_hint(workflow_id: str, step: Step) -> str:
    call = step.calls[0] if step.calls else None
    call_id = f" {call.id}" if call else ""
    return (
        f"  decide with: {client_command()} approve {workflow_id}{call_id}"
        f"   (or: {client_command()} reject {workflow_id}{call_id} --reason '...')"
    )


def principal_of(args: argparse.Namespace, user: str) -> Principal | None:
    """`--tenant/--user/--role` as a principal (`user`: the default of `--user`); None
    when none is given. Trusted only for local use (the module's docstring)."""
    if args.tenant is None and args.user is None and not args.role:
        return None
    try:
        return Principal(
            tenant=args.tenant or DEFAULT_TENANT, user=args.user or user, roles=args.role or ()
        )
    except ValidationError as e:
        raise CliError(
            "; ".join(
                f"--{str(err['loc'][0]).removesuffix('s')}: "
                f"{str(err['msg']).removeprefix('Value error, ')}"
                for err in e.errors()
            )
        ) from None


def add_principal(p: argparse.ArgumentParser, who: str) -> None:
    local = "trusted only for local use"
    p.add_argument("--tenant", help=f"the tenant of who {who} (default: default; {local})")
    p.add_argument("--user", help=f"who {who}, in that tenant ({local})")
    p.add_argument(
        "--role", action="append", metavar="ROLE", help=f"a role of who {who}, repeatable ({local})"
    )


async def cmd_ask(args: argparse.Namespace) -> int:
    question = sys.stdin.read() if args.question == "-" else args.question
    chosen = choose_agent(args.agent)
    principal = principal_of(args, args.customer)
    secrets = secrets_of(args)
    try:
        turn = TurnInput(
            question=question,
            **({"principal": principal} if principal else {"customer_id": args.customer}),
            agent=chosen.name,
            model=args.model,
            limits=limits(args),
            stream=args.follow,
            context=context_of(args),
            settings=settings_of(args),
        )
    except ValidationError as e:
        raise input_error(e) from None
    async with session(
        args.task_queue, self_contained=args.embedded, agent=chosen, mcp_config=mcp_config(args)
    ) as conn:
        agents = client_of(conn, args)
        taken = chosen.definition.attachments if chosen.definition else None
        turn, workflow_id = await agents.attach(turn, args.attach or [], taken)
        turn, workflow_id = await agents.seal(turn, secrets, workflow_id=workflow_id)
        handle = await agents.start_turn(turn, workflow_id=workflow_id)
        if args.no_wait:
            print(handle.id)
            return 0
        print(f"turn {handle.id} started", file=sys.stderr)
        watchdog = asyncio.create_task(nobody_picks_up(conn.client, handle, args.task_queue))
        writing = Writing(f"[~] {'writing':<11} ")
        try:
            async for _, event in handle.events():
                watchdog.cancel()
                if isinstance(event, TokensEvent):
                    writing.add(event)
                    continue
                writing.end()
                if not isinstance(event, StepEvent):
                    continue
                step = event.step
                if args.follow:
                    print(step.render(), flush=True)
                if step.kind is StepKind.APPROVAL:
                    if not args.follow:
                        print(step.render(), flush=True)
                    print(decide_hint(handle.id, step), flush=True)
                elif step.kind is StepKind.QUESTION and step.calls:  # asked, not answered
                    if not args.follow:
                        print(step.render(), flush=True)
                    print(f"  answer with: {client_command()} answer {handle.id}", flush=True)
            result = await handle.result()
        except asyncio.CancelledError:
            print(
                "\nstopped waiting; the turn goes on. "
                f"See it with: {client_command()} show {handle.id}",
                file=sys.stderr,
            )
            raise
        finally:
            watchdog.cancel()
        return await print_result(conn, handle, result, sizes=args.sizes)


PICK_UP_S = 8.0


async def nobody_picks_up(client: Client, handle: TurnHandle, task_queue: str) -> None:
    """Say so, once, when no worker has taken the turn after a few seconds."""
    await asyncio.sleep(PICK_UP_S)
    serving = await workers(client, task_queue)
    print(
        f"note: no worker has picked up turn {handle.id} after {PICK_UP_S:g} s; "
        + (no_worker(task_queue, serving) if not serving.live else "the workers may be busy"),
        file=sys.stderr,
    )


def chat_input(args: argparse.Namespace, chosen: Chosen) -> ConversationInput:
    """A conversation as `chat` and `web` start it: its turns stream their text."""
    idle = duration("--idle-timeout", args.idle_timeout, "minutes")
    try:
        return ConversationInput(
            customer_id=args.customer,
            agent=chosen.name,
            model=args.model,
            limits=limits(args),
            idle_timeout=idle,
            stream=True,
            context=context_of(args),
            settings=settings_of(args),
        )
    except ValidationError as e:
        raise input_error(e) from None


ATTACH = "/attach "
"""In `chat`, a line `/attach PATH` attaches a file to the next message."""


async def cmd_chat(args: argparse.Namespace) -> None:
    chosen = choose_agent(args.agent)
    chat = chat_input(args, chosen)
    interactive = sys.stdin.isatty()
    lines = Lines()
    async with session(
        args.task_queue, self_contained=args.embedded, agent=chosen, mcp_config=mcp_config(args)
    ) as conn:
        conversation = client_of(conn, args).chat_from(chat)
        started = False
        taken = chosen.definition.attachments if chosen.definition else None
        files: list[str] = []
        while True:
            text = await lines.read("you> " if interactive else "")
            if text is None:
                break
            if not text.strip():
                continue
            if not interactive:
                print(f"you> {text}", flush=True)
            if text.startswith(ATTACH):
                files.append(text.removeprefix(ATTACH).strip())
                print(f"(attached to your next message: {files[-1]})", file=sys.stderr)
                continue
            try:
                turn = await conversation.start(text, attachments=files, limits=taken)
            except AgentClientError as e:
                print(f"error: {e}", file=sys.stderr)
                continue
            finally:
                files = []  # sent, or refused: either way, attached again by hand
            if not started:
                started = True
                print(f"(conversation {conversation.id}; Ctrl-D ends it)", file=sys.stderr)
            if not await answer_turn(turn, lines):
                break
        if started:
            with contextlib.suppress(AgentClientError, RPCError):
                await conversation.end()
            print(f"(conversation {conversation.id} ended)", file=sys.stderr)


async def answer_turn(turn: TurnHandle, lines: Lines) -> bool:
    """Print a turn's steps and its answer as it is written, asking inline for any
    approval it needs and any MCP server's question (`questions`: elicitation, and
    consent to a server's use of the model). False when input ended at one (the call
    stays pending, the question waiting)."""
    writing = Writing("agent> ")
    async for _, event in turn.events():
        if isinstance(event, TokensEvent):
            writing.add(event)
            continue
        if isinstance(event, DoneEvent):
            # What was written is a draft: the turn's answer is what counts (an
            # output shield may have refused the draft).
            if writing.text != event.answer:
                writing.end()
                print(f"agent> {event.answer}", flush=True)
            writing.end()
            continue
        step = event.step
        if step.kind in (StepKind.ANSWER, StepKind.LIMIT):
            continue
        writing.end()
        print(f"  {step.render()}", flush=True)
        if step.kind is StepKind.APPROVAL and step.calls:
            call = step.calls[0]
            reply = await lines.read(f"approve {call.render()}? [y/N] ")
            if reply is None:
                print(decide_hint(turn.id, step), flush=True)
                return False
            yes = reply.strip().lower() in ("y", "yes")
            try:
                decide = turn.approve if yes else turn.reject
                await decide(call.id, by="customer")
            except AgentClientError as e:
                print(f"error: {e}", file=sys.stderr)
        elif (
            step.kind is StepKind.QUESTION
            and step.calls  # asked, not answered yet
            and not await answer_question(turn, step, lines.read)
        ):
            print(f"  answer with: {client_command()} answer {turn.id}", flush=True)
            return False
    return True


class Writing:
    """Prints a model's text as it is written, on a line of its own. A retried
    model call starts again, on a new line, so no text is ever shown twice."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._drafts = Drafts()
        self._call = ""
        self._open = False

    @property
    def text(self) -> str:
        """What the latest model call that wrote has written."""
        return self._drafts.text(self._call)

    def add(self, event: TokensEvent) -> None:
        change = self._drafts.add(event)
        if change == "stale":
            return
        if change != "continued" or not self._open:
            self.end()
            again = "(again) " if change == "restarted" else ""
            print(f"{self._prefix}{again}{self._drafts.text(event.call)}", end="", flush=True)
            self._call, self._open = event.call, True
            return
        print(event.text, end="", flush=True)

    def end(self) -> None:
        """Close the line being written."""
        if self._open:
            print(flush=True)
            self._open = False


class Lines:
    """Lines from standard input, read without blocking the event loop."""

    async def read(self, prompt: str) -> str | None:
        if prompt:
            print(prompt, end="", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            if prompt:
                print()
            return None
        return line.rstrip("\n")


async def cmd_pending(args: argparse.Namespace) -> None:
    customer = customer_filter(args)
    async with session(args.task_queue, self_contained=False) as conn:
        waiting = await client_of(conn, args).pending(customer)
        asked = await client_of(conn, args).questions(customer)
        now = datetime.now(timezone.utc)
        for a in asked:  # an MCP server's question: `answer` takes it
            q = a.question
            since = int((now - q.since).total_seconds()) if q.since else 0
            where = f"  {q.url}  (at {q.domain})" if q.mode == "url" else ""
            fields = ", ".join((q.requested_schema or {}).get("properties", {}))
            form = f"  form: {fields}" if fields else ""
            print(
                f"{a.workflow_id}  {q.id}  {q.server} asks: {_line(q.message)}{where}{form}  "
                f"{since}s"
            )
        if not waiting:
            if not asked:
                print("no calls awaiting approval, no questions awaiting an answer")
            return
        for w in waiting:
            build = w.version.rpartition(":")[2]
            print(
                f"{w.workflow_id}  {w.approval.call.id}  {w.approval.call.render()}  {w.age(now)}"
                + (f"  {build}" if build else "")
                + (f"  (waiting for workers of {build or 'its task queue'})" if w.stalled else "")
            )


def _line(text: str, limit: int = 200) -> str:
    """A server's words on one line of a listing."""
    shown = " ".join(text.split())
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


async def cmd_answer(args: argparse.Namespace) -> int:
    """An MCP server's question answered: accept (with the form's fields as JSON),
    decline or cancel. Checked against the question before it is sent."""
    turn_id = workflow_id(args.workflow_id)
    question_id = args.question_id.strip() if args.question_id is not None else None
    if question_id is not None and not (question_id.isprintable() and 0 < len(question_id) <= 200):
        raise CliError("QUESTION_ID: give the id `pending` shows (e.g. c1.q1), or leave it out")
    if not " ".join(args.by.split()):
        raise CliError("--by: give who answers, for the record")
    content = None
    action: Action = "decline" if args.decline else "cancel" if args.cancel else "accept"
    if args.accept not in (None, ""):
        try:
            content = json.loads(args.accept)
        except ValueError as e:
            raise CliError(f"--accept: not JSON ({e})") from None
    async with session(args.task_queue, self_contained=False) as conn:
        turn = client_of(conn, args).turn(turn_id)
        answered = await turn.answer(question_id, action=action, content=content, by=args.by)
    question = answered.question
    print(f"{action}: {question.server}'s question {question.id} ({question.tool})")
    if answered.later:
        print(
            "no worker of the turn's version runs now: the answer is recorded, and applies "
            "when one runs the turn"
        )
    return 0


async def cmd_decide(args: argparse.Namespace) -> int:
    approved = args.command == "approve"
    turn_id = workflow_id(args.workflow_id)
    call_id = args.call_id.strip() if args.call_id is not None else None
    if call_id is not None and not (call_id.isprintable() and 0 < len(call_id) <= 200):
        raise CliError("CALL_ID: give the id `pending` shows (e.g. call_1), or leave it out")
    reason = getattr(args, "reason", "") or ""
    if not " ".join(args.by.split()):
        raise CliError("--by: give who decides, for the record")
    try:  # as the turn will check it, before anything is sent
        ApprovalDecision(call_id=call_id or "-", approved=approved, by=args.by, reason=reason)
    except ValidationError as e:
        raise CliError(
            "; ".join(f"--{err['loc'][0]}: {err['msg']}" for err in e.errors())
        ) from None
    principal = principal_of(args, args.by)  # checked as the flags are read
    decision = "approval" if approved else "rejection"
    # What a Ctrl-C leaves, said in one line: the decision is sent or not, taken or not.
    interrupted = f"interrupted before the {decision} was sent: nothing was decided"
    try:
        async with session(args.task_queue, self_contained=False) as conn:
            turn = client_of(conn, args).turn(turn_id)
            interrupted = (
                f"interrupted while turn {turn_id} had not yet taken the {decision}: it may "
                f"still take it; see `{client_command()} show {turn_id}`"
            )
            if approved:
                result = await turn.approve(call_id, by=args.by, principal=principal, via="cli")
            else:
                result = await turn.reject(
                    call_id, by=args.by, reason=reason, principal=principal, via="cli"
                )
            print(
                f"{'approved' if result.approved else 'rejected'}: {result.tool} ({result.call_id})"
            )
            if result.later:
                print(
                    "no worker of the turn's version runs now: the decision is recorded, and "
                    "applies when one runs the turn (start a worker of that version; see "
                    "`versions`)"
                )
            if not args.wait:
                return 0
            interrupted = (
                f"stopped waiting; the {decision} is recorded and the turn goes on. "
                f"See it with: {client_command()} show {turn_id}"
            )
            return await print_result(conn, turn, await turn.result())
    except asyncio.CancelledError:
        print(f"\n{interrupted}", file=sys.stderr)
        raise
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        # The SDK says a cancelled update (Ctrl-C) so: it is one all the same.
        if getattr(args, "signals", None):
            print(f"\n{interrupted}", file=sys.stderr)
            raise asyncio.CancelledError from None
        raise CliError(
            f"turn {turn_id} had not taken the {decision} when the server stopped waiting: "
            f"it may still take it; see `{client_command()} show {turn_id}`"
        ) from None


async def cmd_wake(args: argparse.Namespace) -> int:
    """End a turn's waits early (`wait`, `wait_for_event`); the model reads who woke it."""
    turn_id = workflow_id(args.workflow_id)
    async with session(args.task_queue, self_contained=False) as conn:
        woke = await client_of(conn, args).turn(turn_id).wake(by=args.by)
    print(f"woke turn {turn_id}: {_woken(woke)}")
    return 0


async def cmd_event(args: argparse.Namespace) -> int:
    """Deliver an event to a turn that waits for one of its name; refused in one line
    before anything is sent when the name or the JSON is not one a turn takes."""
    turn_id = workflow_id(args.workflow_id)
    try:
        data = json.loads(args.json)
    except (json.JSONDecodeError, RecursionError) as e:
        raise CliError(
            f'JSON: give the event\'s data as JSON, e.g. \'{{"status": "delivered"}}\' ({e})'
        ) from None
    checked_event(WorldEvent(name=args.name, data=data, by=args.by))
    async with session(args.task_queue, self_contained=False) as conn:
        woke = await client_of(conn, args).turn(turn_id).send_event(args.name, data, by=args.by)
    print(f"event {args.name} delivered to turn {turn_id}: {_woken(woke)}")
    return 0


def _woken(woke: Woke) -> str:
    if woke.later:
        return (
            "no worker runs the turn now: it is recorded, and applies when one runs the "
            "turn, if the turn still waits then"
        )
    return ", ".join(f"{tool} ({call})" for call, tool in zip(woke.calls, woke.tools, strict=True))


_AGO = re.compile(r"(\d{1,6})([dhm])")


def since_of(value: str | None) -> datetime | None:
    """`audit --since`: `7d`, `12h`, `30m` ago, or an ISO date or time (UTC if it names
    no zone); CliError in one line otherwise."""
    if value is None:
        return None
    now = datetime.now(timezone.utc)
    if ago := _AGO.fullmatch(value.strip()):
        unit = {"d": "days", "h": "hours", "m": "minutes"}[ago.group(2)]
        return now - timedelta(**{unit: int(ago.group(1))})
    try:
        at = datetime.fromisoformat(value.strip())
    except ValueError:
        raise CliError(
            f"--since {value[:40]!r}: give 7d, 12h, 30m, or a date or time (2026-12-01T09:00)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


async def cmd_audit(args: argparse.Namespace) -> None:
    """Every decision on a write, with who asked, who decided, the call and its result."""
    since = since_of(args.since)
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        rows = await client_of(conn, args).audit(
            tenant=args.tenant, user=args.user, since=since, limit=args.limit
        )
    for row in rows:
        print(row.model_dump_json() if args.json else row.line())
    if not rows and not args.json:
        print("no decisions found")


async def cmd_list(args: argparse.Namespace) -> None:
    customer = customer_filter(args)
    agent = args.agent.strip() if args.agent else None
    if agent is not None and not re.fullmatch(AGENT_NAME_PATTERN, agent):
        raise CliError(f"--agent {agent!r}: give an agent's name")
    if args.schedule is not None and not NAME_PATTERN.fullmatch(args.schedule):
        raise CliError(f"--schedule {args.schedule[:60]!r}: give a schedule's name")
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        rows = await client_of(conn, args).find(
            agent=agent,
            customer=customer,
            outcome=args.outcome,
            awaiting_approval=args.awaiting_approval,
            limit=args.limit,
            schedule=args.schedule,
            tenant=args.tenant,
            user=args.user,
        )
        if not rows:
            print("no turns found")
        width = max((len(r.workflow_id) for r in rows), default=0)
        for r in rows:
            started = r.started.astimezone().strftime("%Y-%m-%d %H:%M:%S")
            tools = ",".join(r.tools) or "-"
            agent_column = f"{r.agent or '-'}@{r.fingerprint}" if r.fingerprint else r.agent or "-"
            build = r.version.rpartition(":")[2] or "-"
            print(
                f"{r.workflow_id:<{width}}  {started}  {r.status:<17}  {r.outcome or '-':<13}  "
                f"{agent_column}  {build}  {r.model or '-'}  {tools}  {r.question!r}"
                + (f"  schedule: {r.schedule}" if r.schedule else "")
                + (f"  tenant: {r.tenant}" if r.tenant and r.tenant != DEFAULT_TENANT else "")
            )


async def cmd_schedule(args: argparse.Namespace) -> int:
    """`schedule ...`: the schedules live in the server; no worker is needed to keep them."""
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        return await schedules_cli.run(client_of(conn, args), args)


def deployment_of(args: argparse.Namespace) -> str:
    deployment = (args.deployment or os.environ.get("AGENT_DEPLOYMENT") or args.task_queue).strip()
    if not deployment or len(deployment) > 255 or not deployment.isprintable():
        raise CliError(f"--deployment {args.deployment!r}: give a worker deployment's name")
    return deployment


def no_deployment(deployment: str) -> str:
    return (
        f"no worker deployment {deployment!r}: workers are versions of one once "
        "they start with AGENT_VERSIONING=on (the default)"
    )


async def cmd_versions(args: argparse.Namespace) -> int:
    deployment = deployment_of(args)
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        now = await deployments.routing(conn.client, deployment)
        if now is None:
            print(no_deployment(deployment))
            return 1
        reports = await deployments.versions(
            conn.client, deployment, indexed=await search.available(conn.client)
        )
        ramp = f", ramping {now.ramping} at {now.ramping_percentage:g}%" if now.ramping else ""
        print(f"deployment {deployment}: current {now.current or '(none)'}{ramp}")
        for r in reports:
            for line in version_lines(r):
                print(line)
        return 0


def version_lines(r: deployments.VersionReport) -> list[str]:
    """A version's line, and for one that took new work before, what still needs its
    workers: turns finish on it; conversations move to the current version between
    turns (those mid-turn once their turn ends, idle ones at their next message or
    when `move-conversations` wakes them), each in one workflow task on it."""
    waiting = f" ({r.awaiting_approval} awaiting approval)" if r.awaiting_approval else ""
    chats = counted(r.conversations, "conversation")
    if r.conversations and r.idle is not None:
        chats += f" ({r.mid_turn} mid-turn, {r.idle} idle)"
    turns = counted(r.turns, "turn")
    lines = [f"  {r.build_id:<24} {r.status:<9} {turns} running{waiting}, {chats}"]
    if r.takes_new_work:
        return lines
    if not r.needs_workers:
        if r.status not in ("draining", "drained"):
            return lines  # never current (a new version, say): nothing to say yet
        return [*lines, f"    nothing needs the workers of {r.build_id}: stop them"]
    parts = [f"{turns} finish on it"] if r.turns else []
    idle = r.conversations if r.idle is None else r.idle
    if r.mid_turn:
        parts.append(f"{counted(r.mid_turn, 'conversation')} move when their turn ends")
    if idle:
        which = "idle conversation" if r.idle is not None else "conversation"
        parts.append(
            f"{counted(idle, which)} move at their next message "
            f"(or now: {client_command()} move-conversations)"
        )
    return [*lines, f"    {r.build_id} still needs its workers: {'; '.join(parts)}"]


def counted(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


async def cmd_move_conversations(args: argparse.Namespace) -> int:
    deployment = deployment_of(args)
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        now = await deployments.routing(conn.client, deployment)
        if now is None or not now.current:
            print(
                no_deployment(deployment) if now is None else f"{deployment} has no current version"
            )
            return 1
        woken = await deployments.move_conversations(conn.client, deployment)
        if not woken:
            print(f"no conversation runs on a version other than {now.current}")
        for build, count in sorted(woken.items()):
            print(
                f"{counted(count, 'conversation')} on {build} asked to move to "
                f"{now.current}: idle ones move now, the others when their turn ends (both "
                f"need the workers of {build} for that step)"
            )
        return 0


async def cmd_server(args: argparse.Namespace) -> int:
    """A Temporal dev server with this project's flags, recorded as this folder's, until
    Ctrl-C or SIGTERM (which warn when others still use it)."""
    if is_listening(LOCAL_HOST, args.port):
        raise CliError(
            f"something already listens on {LOCAL_HOST}:{args.port} (a server that "
            f"`{worker_command()}` started, perhaps: stop that worker first), or give --port"
        )
    port = args.port or free_port()
    server = EmbeddedServer(Path(args.db_file), port, args.ui_port or free_port(besides={port}))
    conn = await serve_alone(server)
    try:
        print(
            f"Temporal server on {server.address}, Web UI {conn.ui_url}, data in "
            f"{args.db_file}; Ctrl-C stops it",
            flush=True,
        )
        while (code := server.exit_code()) is None:
            await asyncio.sleep(SERVER_WATCH_S)
        raise CliError(f"the Temporal server exited (code {code}); see {server.log_file}")
    finally:
        await conn.aclose()


SERVER_WATCH_S = 0.5
"""How often `server` looks whether its server still runs."""


async def cmd_erase(args: argparse.Namespace) -> int:
    """Erase a turn (with --conversation, its whole conversation): one line per run
    erased, as it goes (`AgentClient.erase`)."""
    turn_id = workflow_id(args.turn)
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        erased = await client_of(conn, args).erase(
            turn_id, conversation=args.conversation, said=lambda run: print(run.line(), flush=True)
        )
    print(f"erased {len(erased)} execution(s) and their stored payloads")
    return 0


async def cmd_show(args: argparse.Namespace) -> int:
    turn_id = workflow_id(args.workflow_id)
    async with session(args.task_queue, self_contained=False, needs_worker=False) as conn:
        turn = client_of(conn, args).turn(turn_id)
        handle = turn.temporal
        try:
            desc = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise CliError(f"no turn with workflow id {turn_id!r}") from None
            raise
        print(f"{desc.id} ({desc.status.name.lower() if desc.status else 'unknown'})")
        if origin := await rewind.origin_of(desc):
            print(origin.line())
        opened = await started_with(handle, "AgentTurn", TurnInput)
        words = await memory_words(opened)
        for attached in opened.attachments if opened else []:
            print(f"attached: {attached.line()}")
        if args.follow and desc.status == WorkflowExecutionStatus.RUNNING:
            writing = Writing(f"[~] {'writing':<11} ")
            async for _, event in turn.events():
                if isinstance(event, TokensEvent):
                    writing.add(event)
                elif isinstance(event, StepEvent):
                    writing.end()
                    print(words(event.step.render()), flush=True)
            return await print_result(conn, turn, await turn.result(), sizes=True)
        if desc.status == WorkflowExecutionStatus.RUNNING:
            if lost := await turn.lost_task():
                print(lost.line())
            try:
                progress = await turn.progress(timeout=SHOW_QUERY_S)
            except WorkerNeeded:
                # No worker to ask: what the history holds, and what is missing.
                for line in await history_view(handle):
                    print(line)
                print_running(desc.typed_search_attributes)
                await print_size(turn)
                print(
                    "note: no worker answered, so this is the history only; the live steps "
                    f"need a running worker (`{worker_command()}`)",
                    file=sys.stderr,
                )
                return 0
            for step in progress.steps:
                print(words(step.render()))
                if step.kind is StepKind.APPROVAL and any(
                    p.call.id == c.id for p in progress.pending for c in step.calls
                ):
                    print(decide_hint(desc.id, step))
            print_running(desc.typed_search_attributes)
            await print_size(turn)
            return 0
        if desc.status not in SHOWN_ENDS:
            raise CliError(f"turn {desc.id} ended as {desc.status.name if desc.status else '?'}")
        result = await turn.result()  # a turn that failed: its outcome, or why, in one line
        for step in result.steps:
            print(words(step.render()))
        return await print_result(conn, turn, result, sizes=True)


async def memory_words(opened: TurnInput | None) -> Callable[[str], str]:
    """How `show` prints a step: a memory the turn recalled (recorded as `[memory mem_…]`)
    in its words, from this folder's memory store as `memory list` reads it, for the
    turn's own customer only; `[forgotten memory mem_…]` once forgotten."""
    if opened is None:
        return str
    who = opened.asker
    try:
        return await MemoryAccess().words_for(who.user, tenant=who.tenant)
    except (AgentClientError, MemoryUnavailable, OSError, sqlite3.Error) as e:
        # The steps matter more than the words: shown as recorded, and why.
        print(f"note: recalled memories shown as recorded ({e})", file=sys.stderr)
        return str


SHOW_QUERY_S = 5.0
SHOWN_ENDS = (
    WorkflowExecutionStatus.COMPLETED,
    WorkflowExecutionStatus.FAILED,
    WorkflowExecutionStatus.TERMINATED,  # a worker ends a turn that cannot read its record
)


def print_running(attributes: TypedSearchAttributes) -> None:
    """A running turn's agent, fingerprint and worker version, as the server has them:
    the version from its first step; the agent once the turn has said (when it first
    waits for approval, else when it ends)."""
    agent, fingerprint = attributes.get(keys.AGENT), attributes.get(keys.FINGERPRINT)
    if agent and fingerprint:
        print(f"agent: {agent} (fingerprint {fingerprint})")
    if version := attributes.get(deployments.VERSION):
        print(f"version: {version}")


async def cmd_demo(args: argparse.Namespace) -> None:
    async with session(
        args.task_queue, self_contained=True, agent=choose_agent(""), mcp_config=args.mcp_config
    ) as conn:
        agents = client_of(conn, args)
        for question in DEMO_QUESTIONS:
            result = await agents.ask(question, model=args.model, no_worker_after=None)
            done = f"{result.workflow_id}, {result.outcome.value}"
            print(f"Q: {question}\nA: {result.answer}\n   ({done})\n")
        if conn.ui_url:
            print(f"See every turn in the Web UI: {conn.workflows_url}")
            if conn.server:
                print(
                    f"(the embedded server stops with this command; `{worker_command()}` keeps one)"
                )


async def cmd_web(args: argparse.Namespace) -> None:
    from durable_agent.frontends.web import serve

    chosen = choose_agent(args.agent)
    chat = chat_input(args, chosen)
    # Self-contained like `demo`: on a fresh machine the page works with nothing else running.
    async with session(
        args.task_queue, self_contained=True, agent=chosen, mcp_config=args.mcp_config
    ) as conn:
        # The words of the agent that answers: the one named, or this command's own
        # worker's first; else the page asks the task queue's current version.
        await serve(
            conn,
            chat,
            host=args.host,
            port=args.port,
            task_queue=args.task_queue,
            agent=chosen.definition or (conn.served[0] if conn.served else None),
        )


def add_agent(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--agent", default="", metavar="NAME|MODULE:ATTRIBUTE", help=help)


def add_idle_timeout(p: argparse.ArgumentParser) -> None:
    default = ConversationInput.model_fields["idle_timeout"].default
    p.add_argument(
        "--idle-timeout",
        type=number_of("minutes"),
        metavar="MINUTES",
        default=default.total_seconds() / 60,
        help="minutes a conversation waits for the next message before it ends "
        "(default: %(default)g)",
    )


def add_turn_options(p: argparse.ArgumentParser) -> None:
    defaults = TurnLimits()
    add_agent(
        p, "the agent that answers: its name, or MODULE:ATTRIBUTE (default: the worker's first)"
    )
    p.add_argument(
        "--customer", default=DEFAULT_CUSTOMER, help="customer id (default: %(default)s)"
    )
    p.add_argument(
        "--model",
        default="",
        type=model_spec,
        help="model spec, e.g. openai:gpt-4o, or several separated by commas, each asked "
        "when the one before fails for good (default: the agent's)",
    )
    p.add_argument(
        "--context",
        metavar="JSON",
        help="the turn's context, a JSON object its tools and instructions read, e.g. "
        '\'{"name": "Ada", "plan": "pro"}\' (at most 16 KB)',
    )
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a model setting of the turn, over the agent's: temperature, top_p, max_tokens, "
        "stop, seed, parallel_tool_calls, reasoning_effort, or extra.NAME for a provider's "
        "own parameter; the value is JSON where it parses, else text (e.g. --set "
        "temperature=0.2 --set stop=END); again for each",
    )
    # Limits: none given, the agent's apply; any given, exactly these (the rest default).
    p.add_argument(
        "--max-steps",
        type=whole_number(),
        help=f"rounds of tool calls per turn (default: the agent's, else {defaults.max_steps})",
    )
    p.add_argument(
        "--max-duration",
        type=number_of("seconds"),
        help="seconds of work per turn, not counting waits for approval (default: the "
        f"agent's, else {defaults.max_duration.total_seconds():g})",
    )
    p.add_argument(
        "--max-tokens", type=whole_number(), help="token budget of a turn (default: none)"
    )
    p.add_argument(
        "--max-cost",
        type=number_of("US dollars"),
        metavar="USD",
        help="spending cap of a turn in US dollars (default: none); a model with no known "
        "price is refused (AGENT_MODEL_PRICES gives one)",
    )
    p.add_argument(
        "--approval-timeout",
        type=number_of("seconds"),
        help="seconds a call waits for approval before it is dropped (default: the "
        f"agent's, else {defaults.approval_timeout.total_seconds():g})",
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="start a server and worker in this process if none are running",
    )


def add_mcp_config(p: argparse.ArgumentParser, when: str = "") -> None:
    p.add_argument(
        "--mcp-config",
        metavar="FILE",
        default="",
        help=f"{when}MCP servers whose tools the worker this command starts also offers: "
        '{"mcpServers": {"NAME": {"command": ..., "args": [...]} or {"url": ...}}} '
        "(docs/mcp.md); the agent's own servers are connected in any case",
    )


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=client_command(),
        description="Ask agents; every question is a durable Temporal workflow (a turn).",
    )
    p.add_argument(
        "--task-queue", default=TASK_QUEUE, type=task_queue_name, help="default: %(default)s"
    )
    sub = p.add_subparsers(dest="command", required=True)

    ask = sub.add_parser("ask", help="ask one question")
    ask.add_argument("question", help="the question, or - to read it from standard input")
    ask.add_argument("--follow", action="store_true", help="print each step as it happens")
    add_principal(ask, "asks")
    ask.add_argument(
        "--no-wait", action="store_true", help="print the turn's workflow id and return at once"
    )
    ask.add_argument(
        "--sizes",
        action="store_true",
        help="then print its history's size, its number of runs and its bytes in the "
        "payload store (as `show` does)",
    )
    ask.add_argument(
        "--attach",
        action="append",
        metavar="PATH",
        help="a file or image the question is about (PNG, JPEG, GIF, WebP, PDF or text); "
        "repeat it for several",
    )
    ask.add_argument(
        "--secret",
        action="append",
        metavar="NAME=VALUE",
        help="a context value the turn gets as a secret: stored encrypted in the payload "
        "store, never in its history (needs AGENT_ENCRYPTION_KEY); NAME alone takes the "
        "environment variable NAME, out of the process list and the shell's history; "
        "repeat it for several",
    )
    add_turn_options(ask)
    add_mcp_config(ask, "with --embedded: ")
    ask.set_defaults(run=cmd_ask)

    chat = sub.add_parser(
        "chat",
        help="a conversation: one message per line (a line `/attach PATH` attaches a file to the "
        "next), Ctrl-D ends it",
    )
    add_turn_options(chat)
    add_mcp_config(chat, "with --embedded: ")
    add_idle_timeout(chat)
    chat.set_defaults(run=cmd_chat)

    waiting = sub.add_parser("pending", help="calls awaiting approval, one line each")
    waiting.add_argument("--customer", help="only this customer's turns")
    waiting.set_defaults(run=cmd_pending)

    for name, verb in (("approve", "run"), ("reject", "drop")):
        d = sub.add_parser(name, help=f"{verb} a call that awaits approval")
        d.add_argument("workflow_id", help="the turn's workflow id (see `pending`)")
        d.add_argument("call_id", nargs="?", help="which call; needed only if several wait")
        d.add_argument(
            "--by",
            default=getpass.getuser(),
            help="who decides, for the record (default: %(default)s)",
        )
        add_principal(d, "decides")
        if name == "reject":
            d.add_argument("--reason", default="", help="why, for the record and the model")
        d.add_argument("--wait", action="store_true", help="then wait for the turn's answer")
        d.set_defaults(run=cmd_decide)

    wake = sub.add_parser("wake", help="end a turn's waits (wait, wait_for_event) early")
    wake.add_argument("workflow_id", help="the turn's workflow id (see `list`)")
    wake.add_argument("--by", default=getpass.getuser(), help="who wakes it, for the record")
    wake.set_defaults(run=cmd_wake)

    event = sub.add_parser("event", help="deliver an event a turn waits for (wait_for_event)")
    event.add_argument("workflow_id", help="the turn's workflow id (see `list`)")
    event.add_argument("name", help="the event's name, as the turn waits for it")
    event.add_argument("json", help="the event's data, as JSON (at most 64 KB)")
    event.add_argument("--by", default=getpass.getuser(), help="who sends it, for the record")
    event.set_defaults(run=cmd_event)

    ans = sub.add_parser("answer", help="answer an MCP server's question (see `pending`)")
    ans.add_argument("workflow_id", help="the turn's workflow id (see `pending`)")
    ans.add_argument("question_id", nargs="?", help="which question; needed only if several")
    how = ans.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--accept",
        metavar="JSON",
        nargs="?",
        const="",
        help="accept; a form's fields as a JSON object (a URL question: no JSON)",
    )
    how.add_argument("--decline", action="store_true", help="decline to answer")
    how.add_argument("--cancel", action="store_true", help="dismiss the question")
    ans.add_argument(
        "--by",
        default=getpass.getuser(),
        help="who answers, for the record (default: %(default)s)",
    )
    ans.set_defaults(run=cmd_answer)

    lst = sub.add_parser("list", help="recent turns, one line each")
    lst.add_argument("--agent", metavar="NAME", help="only this agent's turns")
    lst.add_argument("--customer", help="only this customer's turns")
    lst.add_argument(
        "--outcome",
        choices=[o.value for o in Outcome],
        help="only turns that ended so (one of: %(choices)s)",
    )
    lst.add_argument(
        "--awaiting-approval", action="store_true", help="only turns waiting for a decision"
    )
    lst.add_argument(
        "--limit",
        type=whole_number(1, MAX_LISTED),
        default=20,
        help="at most this many (default: %(default)s)",
    )
    lst.add_argument("--schedule", metavar="NAME", help="only turns this schedule started")
    lst.add_argument("--tenant", help="only turns asked by this tenant's users")
    lst.add_argument("--user", help="only turns asked by this user (of --tenant, or any tenant)")
    lst.set_defaults(run=cmd_list)

    audit = sub.add_parser(
        "audit", help="every decision on a write: who asked, who decided, what, and its result"
    )
    audit.add_argument("--tenant", help="only turns asked by this tenant's users")
    audit.add_argument("--user", help="only turns asked by this user")
    audit.add_argument("--since", metavar="7d|12h|DATE", help="only turns started since then")
    audit.add_argument(
        "--limit",
        type=whole_number(1, MAX_AUDIT_TURNS),
        default=100,
        help="the newest turns read, at most (default: %(default)s)",
    )
    audit.add_argument("--json", action="store_true", help="one JSON object a line")
    audit.set_defaults(run=cmd_audit)
    schedules_cli.add_parser(sub).set_defaults(run=cmd_schedule)
    memory_cli.add_parser(sub).set_defaults(run=memory_cli.run)

    erase = sub.add_parser(
        "erase",
        help="delete a turn from the server and the payload store: every run, its forks "
        "and sub-agents (an operator's act: what was said in it is gone for good)",
    )
    erase.add_argument("--turn", required=True, metavar="WORKFLOW_ID", help="the turn to erase")
    erase.add_argument(
        "--conversation",
        action="store_true",
        help="a turn of a conversation (or a conversation's id): erase the whole "
        "conversation, all its turns and their forks",
    )
    erase.set_defaults(run=cmd_erase)

    show = sub.add_parser("show", help="print the steps of a running or finished turn")
    show.add_argument("workflow_id")
    show.add_argument(
        "--follow", action="store_true", help="on a running turn: print its steps as they happen"
    )
    show.set_defaults(run=cmd_show)

    versions = sub.add_parser(
        "versions", help="the worker deployment's versions and what still runs on each"
    )
    versions.set_defaults(run=cmd_versions)

    move = sub.add_parser(
        "move-conversations",
        help="wake the conversations on old versions, so idle ones move to the current "
        "version now (their old version's workers run that step)",
    )
    move.set_defaults(run=cmd_move_conversations)
    for command in (versions, move):
        command.add_argument(
            "--deployment", default="", help="default: AGENT_DEPLOYMENT, else the task queue"
        )

    server = sub.add_parser(
        "server",
        help="run a Temporal dev server alone, with this project's settings and search "
        "attributes, until Ctrl-C (workers then connect to it and do not own it)",
    )
    for flag, default in (("--port", LOCAL_PORT), ("--ui-port", LOCAL_UI_PORT)):
        server.add_argument(
            flag, type=port_number, default=default, help="default: %(default)s; 0: a free one"
        )
    server.add_argument(
        "--db-file",
        default=str(state_dir() / "temporal.db"),
        help="its SQLite file (default: %(default)s, the one the worker's own server uses)",
    )
    server.set_defaults(run=cmd_server)

    demo = sub.add_parser("demo", help="run the six sample questions end to end")
    demo.add_argument(
        "--model", default="", type=model_spec, help="model spec (default: the worker's)"
    )
    add_mcp_config(demo)
    demo.set_defaults(run=cmd_demo)

    web = sub.add_parser("web", help="a web chat with the agent, served on this machine")
    add_turn_options(web)
    add_mcp_config(web)
    add_idle_timeout(web)
    web.add_argument("--port", type=port_number, default=8080, help="default: %(default)s")
    web.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; the page has no login)",
    )
    web.set_defaults(run=cmd_web)
    add_rerun(sub)
    return p


def add_rerun(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rerun = sub.add_parser(
        "rerun",
        help="fork a finished turn from one of its steps, with another model or instructions",
    )
    rerun.add_argument("workflow_id", help="the turn's workflow id (see `list`)")
    rerun.add_argument(
        "--from-step",
        type=whole_number(1, MAX_STEP, "a step number (the [N] `show` prints)"),
        required=True,
        metavar="N",
        help="the step the fork decides anew (the [N] of `show`); before it, the "
        "original's conversation and results stand",
    )
    rerun.add_argument(
        "--model", default="", type=model_spec, help="model spec (default: the original's)"
    )
    rerun.add_argument(
        "--instructions",
        metavar="FILE",
        help="other instructions, from FILE (default: the original's, as its agent's "
        "function gave them)",
    )
    add_current(rerun)
    rerun.add_argument(
        "--live-reads",
        action="store_true",
        help="run the reads the original made again, live (default: their recorded results)",
    )
    rerun.add_argument("--follow", action="store_true", help="print each step as it happens")
    rerun.add_argument(
        "--no-wait", action="store_true", help="print the fork's workflow id and return at once"
    )
    rerun.set_defaults(run=cmd_rerun)

    replay = sub.add_parser(
        "replay",
        help="ask another model a finished turn again, its tool calls answered from the "
        "record while they repeat the turn's",
    )
    replay.add_argument("workflow_id", help="the turn's workflow id (see `list`)")
    replay.add_argument(
        "--model", default="", type=model_spec, help="model spec (default: the original's)"
    )
    replay.add_argument(
        "--instructions", metavar="FILE", help="instructions, from FILE (default: the original's)"
    )
    add_current(replay)
    replay.add_argument("--follow", action="store_true", help="print each step as it happens")
    replay.set_defaults(run=cmd_replay, live_reads=False, no_wait=False)


def add_current(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--current",
        action="store_true",
        help="run on the agent as the worker serves it now (its instructions and tools, "
        "after a fix), not the version the turn ran; calls of the record whose tools were "
        "removed or changed are said",
    )


MAX_STEP = 1000
"""`rerun --from-step`: no turn has more steps (`TurnLimits.max_steps` is at most 100)."""


def instructions_of(path: str | None) -> str:
    """`--instructions FILE`: its text; a file that cannot be read or is empty is a CliError."""
    if path is None:
        return ""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CliError(f"--instructions: cannot read {path}: {reason}") from None
    if not text.strip():
        raise CliError(f"--instructions: {path} is empty; give the instructions the fork uses")
    return text


async def cmd_replay(args: argparse.Namespace) -> int:
    """`rerun` from the start, served from the record while the calls repeat the turn's
    in order; then where it left the recording, and what the recording saved."""
    return await cmd_rerun(args, replay=True)


async def cmd_rerun(args: argparse.Namespace, replay: bool = False) -> int:
    """A fork of a finished turn from step N (`durable_agent/rewind.py`), once it has
    ended: its steps (the original's before N first) and its answer, as `show` prints
    them; with --follow, each step as it happens. A call waiting for consent is said
    at once, with how to decide it."""
    turn_id = workflow_id(args.workflow_id)
    instructions = instructions_of(args.instructions)
    async with session(args.task_queue, self_contained=False) as conn:
        agents = client_of(conn, args)
        if replay:
            fork = await agents.replay(
                turn_id, model=args.model, instructions=instructions, current=args.current
            )
        else:
            fork = await agents.rerun(
                turn_id,
                from_step=args.from_step,
                model=args.model,
                instructions=instructions,
                live_reads=args.live_reads,
                current=args.current,
            )
        origin = Origin(parent=turn_id, step=getattr(args, "from_step", 1), replay=replay)
        if args.no_wait:
            print(fork.id)
            return 0
        if args.follow:
            print(f"{fork.id}: {origin.line()}", file=sys.stderr)
        changed: list[Step] = []
        try:
            async for _, event in fork.events():
                if not isinstance(event, StepEvent):
                    continue
                if args.follow or event.step.kind is StepKind.APPROVAL:
                    print(event.step.render(), flush=True)
                if event.step.kind is StepKind.APPROVAL:
                    print(decide_hint(fork.id, event.step), flush=True)
                if event.step.kind is StepKind.CHANGED:
                    changed.append(event.step)
        except AgentClientError:
            pass  # the fork failed: its result says why
        try:
            result = await fork.result()
        except AgentClientError:
            # A fork that stopped: the calls its agent takes otherwise now, then why.
            for step in [] if args.follow else changed:
                print(step.render(), flush=True)
            raise
        if reason := refused_model(result):
            raise CliError(f"fork {fork.id}: its model cannot be used: {reason}")
        if not args.follow:
            print(f"{fork.id}: {origin.line()}")
            for step in result.steps:
                print(step.render())
        code = await print_result(conn, fork, result)
        if replay:
            print(
                replay_line(
                    rewind_compare((await agents.turn(turn_id).result()).steps, result.steps)
                )
            )
        return code


def replay_line(c: Comparison) -> str:
    where = f"diverged at step {c.diverged_at}" if c.diverged_at else "followed the recording"
    return (
        f"replay: {where}; {c.served} of {c.recorded} recorded tool call(s) answered from "
        "the record, not run"
    )


class Terminated(Exception):
    """SIGTERM: the command stops as on Ctrl-C, with exit code 143."""


class Interrupted(Exception):
    """Ctrl-C (SIGINT): exit code 130."""


RECANCEL_S = 3.0
"""A command still running this long after a signal cancelled it is cancelled again:
a cancellation can be missed (asyncio.wait_for on Python 3.11)."""


async def run_command(args: argparse.Namespace) -> int:
    """The command as the root span of its trace (a turn's trace starts where it was
    asked). Ctrl-C and SIGTERM cancel it, so it ends, and exports, cleanly: the loop's
    own handlers, which wake it whichever of the process's threads the signal reached."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    got: list[signal.Signals] = []

    def cancel() -> None:
        if task is not None and not task.done():
            task.cancel()
            loop.call_later(RECANCEL_S, cancel)

    def on_signal(sig: signal.Signals) -> None:
        got.append(sig)
        if len(got) == 1:
            cancel()

    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
    args.signals = got  # a command may tell a cancellation the SDK wrapped from others
    try:
        with telemetry.command_span(f"client.py {args.command}"):
            try:
                return await args.run(args) or 0
            except asyncio.CancelledError:
                if got and got[0] is signal.SIGTERM:
                    raise Terminated from None
                raise
    except asyncio.CancelledError:
        if got:
            raise Interrupted from None
        raise


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return asyncio.run(run_command(args))
    except (CliError, AgentClientError, ServerUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Interrupted):
        return 130
    except Terminated:
        return 143
    except BrokenPipeError:
        # The reader went away (`show ID | head`): what it read is all it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        # Every exit sends the spans first (a trace viewer shows the command at once).
        telemetry.flush()


def run() -> None:
    """The command line (`python client.py`, `durable-agent`): `main`, and its exit code.
    The SDK's threads end before the interpreter does (`runtime.runtimes`, at exit)."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left before the last lines (`list | head`): they go nowhere, rather
        # than into an "Exception ignored" on standard error as the interpreter ends.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(code)


if __name__ == "__main__":
    run()
