"""Tools: plain Python functions with a pydantic argument model, in one registry.

A tool is a function `(args, ctx) -> result` decorated with `@tool`. The
argument model is read from the first parameter's annotation, the description
from the docstring. Adding a tool to an agent is one function plus one line in
the registry:

    class OrderLookup(BaseModel):
        order_id: str = Field(pattern=r"^\\d{6}$", description="6-digit order ID")

    @tool(examples=["Has order 123456 shipped?"])
    def order_status(args: OrderLookup, ctx: ToolContext[Shop]) -> Order:
        \"\"\"Status of one order: item, amount, shipping.\"\"\"
        return ctx.deps.order(ctx.customer_id, args.order_id)

    registry = ToolRegistry([order_status, ...])

`ctx` is trusted: the customer id comes from the turn's input, never from the
model, so a tool can scope every lookup to that customer.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_type_hints

from pydantic import BaseModel, ValidationError

from durable_agent import schemas
from durable_agent.attachments import Attachment
from durable_agent.errors import InvalidCall
from durable_agent.principal import Principal, of_customer
from durable_agent.provenance import roles_of
from durable_agent.render import MAX_RESULT_CHARS_LIMIT
from durable_agent.types import ToolCall

if TYPE_CHECKING:
    from durable_agent.agents import Agent
    from durable_agent.subagents import SubAgent

Deps = TypeVar("Deps")
_ANYONE = Principal(user="-")
"""`ToolContext.principal` left out: the customer in the default tenant is put there."""


@dataclass(frozen=True)
class ToolContext(Generic[Deps]):
    """What a tool may trust: who is asking, and the worker's resources."""

    customer_id: str
    deps: Deps
    idempotency_key: str = ""
    """Stable across retries and worker restarts of the same call
    (`<workflow id>/<iteration>/<call index>`): side effects key on it."""
    context: dict[str, Any] = field(default_factory=dict)
    """The turn's context, as its caller gave it (`TurnInput.context`): who asks and
    where (name, plan, locale, tenant, date). Trusted like `customer_id`: never from
    the model."""
    followed: int = 0
    """In a replay that runs in a world of its own (`AgentClient.replay(...,
    own_world=True)`): how many of the recording's calls, from its first, the replay
    was answered from the record before this call. Such a world starts as the
    original's did; to be where the recording was, it applies their effects before
    this call's (`evals/tau2.py`'s store does). 0 in any other turn."""
    principal: Principal = field(default=_ANYONE)
    """Who asks (`durable_agent.Principal`: tenant, user, roles), from the application's
    authentication, never from the model; `customer_id` is its user. A tool scopes its
    data to the tenant as well as to the user. Left out, the customer in the default
    tenant."""
    documents: Sequence[Attachment] = ()
    """The turn's attached documents, by reference (`durable_agent.attachments`), for a
    tool that searches them (`search_knowledge`); given to that tool only. It reads their
    bytes with `durable_agent.runtime.attachments.load`, which checks they are the
    turn's to read."""

    def __post_init__(self) -> None:
        if self.principal is _ANYONE:
            object.__setattr__(self, "principal", of_customer(self.customer_id))


class ToolSpec(BaseModel):
    """What a model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments."""
    examples: list[str] = []
    """Questions this tool answers: few-shot material for the model."""
    side_effects: bool = False
    """It writes (`Tool.side_effects`): a model calls it only for a request to change
    something, never to answer a question. Chat backends leave it out of what they send."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    args_model: type[BaseModel] | None
    """The arguments as a pydantic model (`@tool`); None for a tool described by a JSON
    schema of its own (`schema`): an MCP server's, a benchmark's."""
    fn: Callable[..., Any]
    examples: tuple[str, ...] = ()
    timeout: timedelta = timedelta(seconds=10)
    """Start-to-close timeout of one attempt."""
    max_attempts: int = 3
    """Attempts on transient errors (timeouts, unavailable backends)."""
    side_effects: bool = False
    """Writes something: it must key its write on `ctx.idempotency_key`, because a
    retried or re-run call reaches it again with the same key."""
    quick: bool = False
    """A quick, read-only lookup: its calls run as local activities, in the worker
    that runs the turn, with no round trip through a task queue (one that runs long
    runs again as a regular activity). Never for tools with side effects: a local
    activity may run again after a crash with no record that it ran."""
    approval: bool | None = None
    """Whether a call waits for a person's consent before it runs; by default, when
    it has side effects. The worker's settings can override it (`durable_agent.approval`)."""
    repeats: bool = False
    """A write whose every call is a new effect that may harmlessly happen again (a
    checkpoint saved, a line logged): where its consent is waived, the same call again
    in one turn runs unasked too. Otherwise a waived write runs unasked once a turn,
    and a copy of it asks (`durable_agent.approval.REPEATED`): 1,000 identical refunds
    in one reply are one refund until a person allows more. Never in a fork: there
    every write asks."""

    max_result_chars: int | None = None
    """How much of one result the model reads (past it, a marker says how much more
    there was); None: the agent's `max_result_chars`."""

    return_direct: bool = False
    """Its rendered result is the final answer: the turn ends without `interpret`."""
    top_level: bool = True
    """Offered to the top-level agent; False: only to sub-agents that name it."""
    agent: SubAgent | None = None
    """Set for an agent tool (`durable_agent.subagents`): a sub-agent answers it."""
    delegate: Agent | None = None
    """The agent that answers it, for a tool made by `Agent.as_tool` (served with it)."""
    schema: dict[str, Any] | None = None
    """The arguments' JSON schema, for a tool without an `args_model`: calls are checked
    against it (`durable_agent.schemas`: patterns on a linear-time engine) and the tool
    gets them as a dict."""
    check: Callable[..., Any] | None = None
    """For a tool that needs consent: `check(args, ctx) -> str`, a read with no side
    effect, run before anyone is asked. It says what the call will change (shown where
    consent is asked), or raises a `ToolError` (`NotAllowed`, `NotFound`) when the call
    cannot succeed: then nobody is asked and the model reads why."""
    in_workflow: str = ""
    """A built-in the turn's workflow runs itself, never as an activity: `wait` or
    `wait_for_event` (`durable_agent.waits`). Empty for every other tool."""

    @property
    def needs_approval(self) -> bool:
        return self.side_effects if self.approval is None else self.approval

    @functools.cached_property
    def spec(self) -> ToolSpec:
        """What a model is offered (made once: a model's JSON schema costs far more to
        generate than a call costs to check)."""
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.parameters,
            examples=list(self.examples),
            side_effects=self.side_effects,
        )

    @functools.cached_property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema the model is given (shared: not to be changed)."""
        if self.args_model is not None:
            return self.args_model.model_json_schema()
        return self.schema or {"type": "object", "properties": {}}

    @functools.cached_property
    def validator(self) -> Any:
        """The validator of a tool described by a schema (`schema`), made once (and
        shared by tools of one schema): checking the schema costs more than a call."""
        return _validator(self.name, self.parameters)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, args: BaseModel, ctx: ToolContext[Any]) -> Any:
        return self.fn(args, ctx)


def schema_tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    fn: Callable[[dict[str, Any], ToolContext[Any]], Any],
    **options: Any,
) -> Tool:
    """A tool described by a JSON schema of its own (an MCP server's, a benchmark's):
    `fn(arguments, ctx)` gets the call's arguments as a dict, checked against
    `parameters`. `options` are `Tool`'s (`side_effects`, `quick`, `timeout`, ...).
    A schema that is not one, or has a pattern no linear-time engine takes
    (look-around, backreferences: `durable_agent.schemas`), is a `TypeError` naming it."""
    if parameters.get("type", "object") != "object":
        raise TypeError(f"tool {name}: its JSON schema must describe an object")
    made = Tool(
        name=name, description=description, args_model=None, fn=fn, schema=parameters, **options
    )
    made.validator  # noqa: B018 (a schema that is not one fails here, not at a call)
    return made


def _validator(name: str, parameters: dict[str, Any]) -> Any:
    try:
        return schemas.validator(parameters)
    except schemas.UnusableSchema as e:
        raise TypeError(f"tool {name}: {e}") from None


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    examples: Sequence[str] = (),
    timeout: timedelta = timedelta(seconds=10),
    max_attempts: int = 3,
    side_effects: bool = False,
    quick: bool = False,
    approval: bool | None = None,
    return_direct: bool = False,
    top_level: bool = True,
    check: Callable[..., Any] | None = None,
    max_result_chars: int | None = None,
    repeats: bool = False,
) -> Any:
    """Turn `fn(args: SomeModel, ctx: ToolContext) -> result` into a `Tool`."""
    # Annotations may be strings (`from __future__ import annotations`) naming a
    # model defined in the caller's scope, e.g. inside a test function.
    caller_locals = sys._getframe(1).f_locals

    def wrap(f: Callable[..., Any]) -> Tool:
        params = list(inspect.signature(f).parameters)
        hints = get_type_hints(f, localns=caller_locals)
        args_model = hints.get(params[0]) if params else None
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise TypeError(
                f"tool {f.__name__}: annotate the first parameter with a pydantic model, "
                "e.g. `def my_tool(args: MyArgs, ctx: ToolContext) -> ...`"
            )
        description = inspect.cleandoc(f.__doc__ or "").strip()
        if not description:
            raise TypeError(f"tool {f.__name__}: add a docstring; the model reads it")
        if quick and side_effects:
            raise TypeError(
                f"tool {f.__name__}: a tool with side effects cannot be quick; its calls "
                "must run as regular activities, recorded once they ran"
            )
        if repeats and not side_effects:
            raise TypeError(
                f"tool {f.__name__}: repeats=True is for a write (side_effects=True) whose "
                "calls may harmlessly happen again; a read may repeat anyway"
            )
        if max_result_chars is not None and not 1 <= max_result_chars <= MAX_RESULT_CHARS_LIMIT:
            raise TypeError(
                f"tool {f.__name__}: max_result_chars must be from 1 to "
                f"{MAX_RESULT_CHARS_LIMIT:,}, not {max_result_chars:,}"
            )
        return Tool(
            name=name or f.__name__,
            description=description,
            args_model=args_model,
            fn=f,
            examples=tuple(examples),
            timeout=timeout,
            max_attempts=max_attempts,
            side_effects=side_effects,
            quick=quick,
            approval=approval,
            return_direct=return_direct,
            top_level=top_level,
            check=check,
            max_result_chars=max_result_chars,
            repeats=repeats,
        )

    return wrap(fn) if fn is not None else wrap


class NotATool(TypeError):
    """Something in an agent's tools that is not a `Tool`: a function without `@tool`,
    most likely."""

    def __init__(self, value: object) -> None:
        name = getattr(value, "__name__", None)
        what = f"function {name}" if callable(value) and name else repr(value)[:60]
        super().__init__(
            f"{what} is not a tool: decorate it with @tool (from durable_agent import tool), "
            "or give a Lambda tool or an agent as a tool (Agent.as_tool())"
        )


TOOL_NAME_PATTERN = r"[A-Za-z0-9_-]{1,64}"
"""What every model API accepts as a tool's name (OpenAI's and Bedrock's rule); a
name outside it would fail only later, at the first model call."""


class BadToolName(ValueError):
    """A tool's name no model API accepts (a space, a dot, over 64 characters)."""

    def __init__(self, name: object) -> None:
        text = name if isinstance(name, str) else ""
        fix = re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_")[:64] or "lookup"
        super().__init__(
            f"tool name {name!r}: a tool's name is 1-64 letters, digits, '_' or '-', as "
            f"model APIs require; name it e.g. {fix!r} (@tool(name={fix!r}), or rename "
            "the function)"
        )


class DuplicateTool(ValueError):
    """Two tools of one agent answer to one name (or one tool is listed twice)."""

    def __init__(self, name: str, *, same: bool) -> None:
        fix = (
            "it is listed twice in the agent's tools: list it once"
            if same
            else "two different tools have this name: rename one (@tool(name=...))"
        )
        super().__init__(f"tool {name!r}: {fix}")


UNKNOWN_TOOL = "unknown tool"
INVALID_ARGUMENTS = "invalid arguments for"
"""How `ToolRegistry.validate` begins its refusals, which are the refused call's result."""


def is_refused_call(text: str) -> bool:
    """Whether a call's (failed) result is the registry's refusal of the call itself (an
    unknown tool, arguments its schema refuses), not something the tool answered."""
    return text.startswith((f"{UNKNOWN_TOOL} ", f"{INVALID_ARGUMENTS} "))


class ToolRegistry:
    """The tools one agent may call, by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self.tools: dict[str, Tool] = {}
        self._specs: list[ToolSpec] | None = None
        self._roles: frozenset[str] | None = None
        for t in tools:
            self.add(t)

    def add(self, t: Tool) -> None:
        if not isinstance(t, Tool):
            raise NotATool(t)
        if not isinstance(t.name, str) or not re.fullmatch(TOOL_NAME_PATTERN, t.name):
            raise BadToolName(t.name)
        if t.name in self.tools:
            raise DuplicateTool(t.name, same=self.tools[t.name] is t)
        if t.args_model is not None:
            try:
                _linear_patterns(t.args_model)
            except schemas.UnusableSchema as e:
                raise schemas.UnusableSchema(f"tool {t.name}: {e}") from None
        self.tools[t.name] = t
        self._specs = None
        self._roles = None

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    @property
    def side_effecting(self) -> list[str]:
        """Names of the tools that write."""
        return [name for name, t in self.tools.items() if t.side_effects]

    @property
    def specs(self) -> list[ToolSpec]:
        """What the top-level agent is offered."""
        # Built once: JSON schema generation costs far more than a model call here.
        if self._specs is None:
            self._specs = [t.spec for t in self.tools.values() if t.top_level]
        return self._specs

    @property
    def roles(self) -> frozenset[str]:
        """The words of every argument name of these tools (`provenance.roles_of`)."""
        if self._roles is None:
            self._roles = roles_of(t.parameters for t in self.tools.values())
        return self._roles

    def specs_for(self, names: list[str] | None) -> list[ToolSpec]:
        """What an agent limited to `names` is offered (None: the top-level agent)."""
        if names is None:
            return self.specs
        return [t.spec for n in names if (t := self.tools.get(n)) is not None]

    def offered(self, names: list[str] | None) -> list[str]:
        if names is None:
            return [s.name for s in self.specs]
        # Names only: building a tool's spec means building its JSON schema.
        return [n for n in names if n in self.tools]

    def validate(self, call: ToolCall, offered: list[str] | None = None) -> Any:
        """The call's arguments as the tool's model, or `InvalidCall` saying what to fix.
        `offered`: the tools this agent was given (None: the top-level agent's)."""
        names = self.offered(offered) if offered is not None else list(self.tools)
        t = self.tools.get(call.name) if call.name in names else None
        if t is None:
            raise InvalidCall(f"{UNKNOWN_TOOL} {call.name!r}; available tools: {', '.join(names)}")
        if call.error:
            raise InvalidCall(f"{INVALID_ARGUMENTS} {call.name}: {call.error}")
        if t.args_model is None:
            return _check_schema(t, call)
        try:
            return t.args_model.model_validate(call.arguments)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                + (f" (got {err['input']!r})" if err["type"] != "missing" else "")
                for err in e.errors()
            )
            raise InvalidCall(f"{INVALID_ARGUMENTS} {call.name}: {problems}") from None


@functools.cache
def _linear_patterns(args_model: type[BaseModel]) -> None:
    """`UnusableSchema` when pydantic would check an argument's pattern with Python's
    backtracking `re` (`regex_engine="python-re"`, a compiled `re.Pattern`): the values
    it would match are what a model wrote."""
    schemas.check_type(args_model.__pydantic_core_schema__)


def _check_schema(t: Tool, call: ToolCall) -> dict[str, Any]:
    """A schema tool's arguments, checked; `InvalidCall` naming each problem."""
    problems = sorted(t.validator.iter_errors(call.arguments), key=lambda e: list(e.path))
    if problems:
        said = "; ".join(
            f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message}" for e in problems
        )
        raise InvalidCall(f"{INVALID_ARGUMENTS} {call.name}: {said}")
    return call.arguments
