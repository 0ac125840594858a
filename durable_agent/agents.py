"""An agent definition: who answers, with what instructions, tools, model and guards.

    from durable_agent import Agent, ToolContext, tool

    @tool(examples=["How much is 978-0-14-118776-1?"], quick=True)
    def book_price(args: BookLookup, ctx: ToolContext[Catalog]) -> Book:
        \"\"\"Price and stock of one book, by its ISBN.\"\"\"
        return ctx.deps.book(args.isbn)

    agent = Agent(
        name="bookstore",
        instructions="You are the bookstore's assistant. ...",
        tools=[book_price],
        deps=Catalog.open,            # opened once per worker, closed at shutdown
    )

Serve it with `python worker.py --agent mymodule:agent` (or `AgentPlugin(agent)` in a
worker of your own) and ask it with `client.py ask --agent bookstore "..."`. Every
setting has a default, so an agent is a name and its tools; what is not given here
comes from the worker's settings (model, shields, approvals: `Settings`).

The definition never enters a workflow's history: a turn names its agent, and the
worker resolves instructions, tools and policies by that name inside activities.
What a turn records is the agent's name and its `fingerprint`, a short hash of its
instructions and tool schemas, so a turn answered by a changed agent shows.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

from pydantic import BaseModel, ValidationError

from durable_agent import fallback
from durable_agent.answers import DECLINE
from durable_agent.approval import ApprovalPolicy
from durable_agent.attachments import AttachmentLimits
from durable_agent.bounds import MAX_CALLS_PER_ROUND, MAX_CALLS_PER_ROUND_LIMIT
from durable_agent.compaction import Compaction
from durable_agent.context_sources import ContextSource
from durable_agent.model_settings import ModelSettings, merged, one_line
from durable_agent.outputs import output_spec
from durable_agent.render import MAX_OBSERVATION_CHARS, MAX_RESULT_CHARS_LIMIT
from durable_agent.shields import ShieldSettings
from durable_agent.tools import Tool, ToolRegistry
from durable_agent.types import TurnLimits

if TYPE_CHECKING:
    from durable_agent.mcp import MCPServer
    from durable_agent.model import ModelFactory

InstructionsFunction = Callable[[dict[str, Any], Any], Union[str, Awaitable[str]]]  # noqa: UP007 - a runtime alias on 3.10
"""`instructions(context, deps) -> str`, sync or async: an agent's instructions for one
turn, from the turn's context (`TurnInput.context`) and the agent's `deps`."""

AGENT_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}\Z"
"""An agent's name: it is a search attribute's value, a metric label and a CLI word.
Match it whole (`re.fullmatch`): a `$` would also match before a final newline."""


class Refusals(BaseModel):
    """What the agent says when it will not answer. The turn gives these texts
    as its answer, so they are the agent's words to its users."""

    decline: str = DECLINE
    """A question its tools do not cover. The default instructions tell chat models to
    reply exactly this; the offline model reads it there too."""
    question: str = ""
    """A question an input shield refused. Empty: "Sorry, I can't help with that
    request." and what the agent helps with (its `description`)."""
    answer: str = (
        "Sorry, I can't share that answer: it held information I may not give out. "
        "Please ask about your own records."
    )
    """An answer an output shield refused."""


class AgentCard(BaseModel):
    """What front ends show of an agent: its name, title, what it helps with and
    questions to start from. A worker publishes its agents' cards with its version
    (`runtime.deployments`), so a front end that has not the definition still speaks
    of the agent that answers on its task queue."""

    name: str
    title: str = ""
    description: str = ""
    examples: list[str] = []
    fingerprint: str = ""

    @classmethod
    def unknown(cls, name: str = "") -> AgentCard:
        """An agent known by its name at most: a neutral card."""
        return cls(name=name, title=name or "Assistant")


MAX_CARD_EXAMPLES = 4


@dataclass(frozen=True, eq=False)
class Agent:
    """One agent: every field but `name` has a default. See the module docstring."""

    name: str
    instructions: str | InstructionsFunction = ""
    """The system prompt every chat model is sent first, unchanged on every call of a
    turn. Empty: a plain one built from `title`, `description` and the decline text.
    Or a function of the turn's context and the agent's deps, sync or async, that
    returns it (`InstructionsFunction`): evaluated once per turn, in an activity, so a
    replay reads the text it gave and never calls it again."""
    tools: Sequence[Tool] | ToolRegistry = ()
    """Python tools (`@tool`), Lambda tools, and agents as tools (`Agent.as_tool`,
    `agent_tool`)."""
    model: str | Sequence[str] = ""
    """Default model spec of its turns (`offline`, `openai:<model>`, ...); a turn may
    name another. Empty: the worker's default (`Settings.model`, AGENT_MODEL). A list
    names models in order: the next gets a request the one before failed for good
    (`durable_agent.fallback`)."""
    description: str = ""
    """What it helps with, in a few words ("questions about your orders and returns"):
    the default instructions and refusals say it; the web chat shows it."""
    title: str = ""
    """How front ends name it ("Support"); empty: its name."""
    examples: Sequence[str] = ()
    """Questions it answers well: the web chat offers them as hints."""
    refusals: Refusals = field(default_factory=Refusals)
    shields: ShieldSettings | None = None
    """Which shields run at each position; None: the worker's (AGENT_SHIELDS_*)."""
    approvals: ApprovalPolicy | None = None
    """Which tools need a person's consent beyond what each tool declares; None:
    the worker's (AGENT_APPROVAL_*)."""
    attachments: AttachmentLimits = field(default_factory=AttachmentLimits)
    """The files and images its questions may carry: how many, how large, which types
    (`durable_agent.attachments`); `AttachmentLimits(max_count=0)` takes none."""
    limits: TurnLimits = field(default_factory=TurnLimits)
    """Limits of a turn that names none (a turn that names limits gets exactly those)."""
    max_result_chars: int = MAX_OBSERVATION_CHARS
    """How much of one tool result the model reads, for tools that set no limit of
    their own (`@tool(max_result_chars=)`)."""
    max_calls_per_round: int = MAX_CALLS_PER_ROUND
    """How many of one reply's tool calls run; the calls past them get one result
    saying so, and the model makes them in a later round."""
    compaction: Compaction | None = field(default_factory=Compaction)
    """How its turns keep their conversation within the model's context window: older
    tool results shortened, then older exchanges summarised (`durable_agent.compaction`).
    `Compaction(window=...)` tells the window of a model that declares none; None
    switches it off."""
    deps: Any = None
    """What tools get as `ctx.deps`: a value, or a zero-argument callable that opens it
    once per worker — its result, or what it yields if it is a context manager (sync
    or async), which is closed when the worker shuts down."""
    models: Mapping[str, ModelFactory | ModelSettings] = field(default_factory=dict)
    """Model kinds this agent adds or replaces (`{"offline": factory}`): a factory gets
    the part of the spec after `kind:` and returns a `Model`. And settings of its own
    for some models (`{"anthropic": ModelSettings(...), "openai:gpt-4o":
    ModelSettings(...)}`): a kind's for every model of that kind, a spec's for that
    model, each over `settings` (`durable_agent.model_settings`)."""
    mcp_servers: Sequence[MCPServer] = ()
    """MCP servers whose tools it also offers (`durable_agent.mcp`): the worker connects
    to them as it starts, and their tools are named `<server>__<tool>`."""
    unknown_outcomes: Literal["ask", "model"] = "ask"
    """A write whose outcome is unknown (it may have run; the system it went to takes no
    idempotency key: an MCP server's, say) is never sent again by itself. `ask`: a
    person decides whether to send it again. `model`: the model is told it may have
    run, and goes on from there (looks it up, or tells the customer)."""
    model_calls: Literal["activity", "local"] = "activity"
    """How its turns call the model. `activity`: each call is an activity of its own,
    which any worker may run, with a heartbeat. `local`: each call runs as a local
    activity inside the workflow task that needs it, which spares two trips through
    the server per call and keeps the call's input out of the history; a call that a
    dying worker left unanswered is made again. For models that answer within seconds:
    a scripted or offline model, a model server next to the worker."""
    output_type: Any = None
    """What its turns end with instead of text: a pydantic model, a dataclass, a
    TypedDict, a list or a scalar type (`durable_agent/outputs.py`). The model gives a
    value of it as its final step; the turn validates it, and `TurnResult.output` holds
    it. None: text. A turn may name its own (`AgentClient.ask(..., output_type=...)`)."""
    settings: ModelSettings | None = None
    """How its models are asked (temperature, output limit, stop sequences, ...): under
    what `models` gives a model and what a turn gives (`AgentClient.ask(settings=)`),
    field by field. A dict of its fields will do. None: the providers' defaults."""
    knowledge: ContextSource | None = None
    """Documents it answers from (`durable_agent.knowledge.Knowledge`): it adds the
    `search_knowledge` tool, and with `retrieve=N` each turn starts with the question's
    top passages (`durable_agent.context_sources`). None: no knowledge."""
    memory: Any = None
    """What its customers told it, kept across conversations (`durable_agent.memory`):
    True, or `MemorySettings(...)`, gives it the `remember(fact)` and `forget(memory_id)`
    writes and the `recall(query)` read, each scoped to the customer (and tenant) the
    turn serves, and each turn starts with that customer's memories most relevant to
    the question. None or False: no memory."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_result_chars <= MAX_RESULT_CHARS_LIMIT:
            raise ValueError(
                f"agent {self.name!r}: max_result_chars must be from 1 to "
                f"{MAX_RESULT_CHARS_LIMIT:,}, not {self.max_result_chars:,}"
            )
        if not 1 <= self.max_calls_per_round <= MAX_CALLS_PER_ROUND_LIMIT:
            raise ValueError(
                f"agent {self.name!r}: max_calls_per_round must be from 1 to "
                f"{MAX_CALLS_PER_ROUND_LIMIT:,}, not {self.max_calls_per_round:,}"
            )
        if self.compaction is not None and not isinstance(self.compaction, Compaction):
            raise ValueError(
                f"agent {self.name!r}: compaction must be a Compaction(...) or None, "
                f"not {type(self.compaction).__name__}"
            )
        if self.unknown_outcomes not in ("ask", "model"):
            raise ValueError(
                f"agent {self.name!r}: unknown_outcomes={self.unknown_outcomes!r}: "
                "use 'ask' (a person decides) or 'model' (the model is told)"
            )
        if self.model_calls not in ("activity", "local"):
            raise ValueError(
                f"agent {self.name!r}: model_calls={self.model_calls!r}: use 'activity' "
                "(each call an activity of its own) or 'local' (a local activity)"
            )
        if not isinstance(self.name, str) or not re.fullmatch(AGENT_NAME_PATTERN, self.name):
            raise ValueError(
                f"agent name {self.name!r}: use 1-64 letters, digits, '_', '.' or '-', "
                "starting with a letter"
            )
        if self.output_type is not None:
            try:
                output_spec(self.output_type)
            except TypeError as e:
                raise ValueError(f"agent {self.name!r}: {e}") from None
        if not isinstance(self.instructions, str) and not callable(self.instructions):
            raise ValueError(
                f"agent {self.name!r}: instructions must be text, or a function "
                f"(context, deps) -> str, not {type(self.instructions).__name__}"
            )
        try:
            fallback.check(self.model)
        except ValueError as e:
            raise ValueError(f"agent {self.name!r}: {e}") from None
        if self.knowledge is not None and not isinstance(self.knowledge, ContextSource):
            raise ValueError(
                f"agent {self.name!r}: knowledge must be a Knowledge([...]) (from "
                f"durable_agent.knowledge import Knowledge), not {type(self.knowledge).__name__}"
            )
        object.__setattr__(self, "memory", self._memory(self.memory))
        # Settings may be given as dicts of their fields, as Pydantic AI's are: kept typed.
        object.__setattr__(self, "settings", self._settings("settings", self.settings))
        models = {
            key: given if callable(given) else self._settings(f"models[{key!r}]", given)
            for key, given in self.models.items()
        }
        object.__setattr__(self, "models", models)

    def _memory(self, given: Any) -> ContextSource | None:
        if given is None or given is False or isinstance(given, ContextSource):
            return given or None
        # The room is imported only for an agent that asks for it (it imports the core).
        from durable_agent.memory import Memory, MemorySettings

        if given is True or isinstance(given, MemorySettings):
            return Memory(None if given is True else given)
        raise ValueError(
            f"agent {self.name!r}: memory must be True or a MemorySettings(...) (from "
            f"durable_agent.memory import MemorySettings), not {type(given).__name__}"
        )

    def _settings(self, where: str, given: Any) -> ModelSettings | None:
        if given is None or isinstance(given, ModelSettings):
            return given
        if not isinstance(given, Mapping):
            raise ValueError(
                f"agent {self.name!r}: {where} must be a ModelSettings(...) (or a factory, in "
                f"models), not {type(given).__name__}"
            )
        try:
            return ModelSettings.model_validate(given)
        except ValidationError as e:
            raise ValueError(f"agent {self.name!r}: {where}: {one_line(e)}") from None

    @property
    def registry(self) -> ToolRegistry:
        """Its tools by name, its context sources' after its own; a name used twice is a
        `ValueError` saying which."""
        own = self.tools.tools.values() if isinstance(self.tools, ToolRegistry) else self.tools
        # A registry made from this one already holds them (an MCP agent's `LiveTools`).
        added = [
            t
            for source in self.context_sources
            for t in source.tools()
            if not any(t is mine for mine in own)
        ]
        if isinstance(self.tools, ToolRegistry) and not added:
            return self.tools
        return ToolRegistry([*own, *added])

    @property
    def context_sources(self) -> list[ContextSource]:
        """What it knows besides its tools (`durable_agent.context_sources`)."""
        return [s for s in (self.knowledge, self.memory) if s is not None]

    @property
    def retrieve(self) -> int:
        """How many passages its turns' retrieval step gives the model (0: no step)."""
        return sum(source.retrieve for source in self.context_sources)

    @property
    def shown_name(self) -> str:
        return self.title or self.name

    @property
    def system_prompt(self) -> str:
        """The instructions, when they are the same for every turn; for instructions
        given as a function, what names the function (each turn evaluates it)."""
        if callable(self.instructions):
            return instructions_identity(self.instructions)
        return self.instructions or default_instructions(self)

    @property
    def dynamic_instructions(self) -> InstructionsFunction | None:
        """The function that gives each turn its instructions, if it has one."""
        return self.instructions if callable(self.instructions) else None

    @property
    def model_specs(self) -> list[str]:
        """Its model specs, in order (empty: the worker's default)."""
        return fallback.specs(self.model)

    @property
    def model_factories(self) -> dict[str, ModelFactory]:
        """The model kinds it adds or replaces (`models` without its settings)."""
        return {k: v for k, v in self.models.items() if not isinstance(v, ModelSettings)}

    def settings_for(self, spec: str) -> ModelSettings | None:
        """Its settings for the model of `spec`: its own, then its kind's (`models`), then
        the spec's, each over the one before field by field."""
        kind = spec.partition(":")[0]

        def given(key: str) -> ModelSettings | None:
            found = self.models.get(key)
            return found if isinstance(found, ModelSettings) else None

        return merged(self.settings, given(kind), given(spec) if spec != kind else None)

    @property
    def question_refusal(self) -> str:
        if self.refusals.question:
            return self.refusals.question
        helps = f" I can help with {self.description.rstrip('.')}." if self.description else ""
        return "Sorry, I can't help with that request." + helps

    def card(self, fingerprint: str = "") -> AgentCard:
        """Its card (`fingerprint`: as its worker serves it; default: its own)."""
        return AgentCard(
            name=self.name,
            title=self.shown_name,
            description=self.description,
            examples=list(self.examples)[:MAX_CARD_EXAMPLES],
            fingerprint=fingerprint or self.fingerprint(),
        )

    def as_tool(self, name: str = "", description: str = "", share_context: bool = True) -> Tool:
        """This agent as another agent's tool: each call is a turn of this agent (a child
        workflow) asked the call's `question`; its answer is the call's result. Its
        turns get the calling turn's context, unless `share_context=False`."""
        from durable_agent.subagents import delegate_to

        name = name or self.name.replace("-", "_").replace(".", "_")
        return delegate_to(self, name, description, share_context)

    def fingerprint(self) -> str:
        """12 hex digits of a hash of what the model is given: the instructions and
        every tool's name, description, schema and examples. It changes exactly when
        the agent a model sees changes."""
        registry = self.registry
        specs = [t.spec.model_dump(mode="json") for t in registry.tools.values()]
        given: dict[str, Any] = {"instructions": self.system_prompt, "tools": specs}
        if self.output_type is not None:  # only then: other agents' fingerprints stay
            given["output"] = output_spec(self.output_type).json_schema
        blob = json.dumps(given, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def instructions_identity(fn: Callable[..., Any]) -> str:
    """What an instructions function is known by in the agent's fingerprint: its name
    and a hash of its source (where Python keeps it), so a change to it shows."""
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    return f"instructions function {name} {hashlib.sha256(source.encode()).hexdigest()[:12]}"


def default_instructions(agent: Agent) -> str:
    """The system prompt of an agent that gives none."""
    who = f"You are {agent.shown_name}"
    what = f", an assistant for {agent.description.rstrip('.')}" if agent.description else ""
    return (
        f"{who}{what}. Use the tools to look things up; never make up data. Call several "
        "tools at once when they do not depend on each other. When the tool results answer "
        "the question, reply briefly from them. If a question is not about what the tools "
        f"cover, reply exactly: {agent.refusals.decline}"
    )
