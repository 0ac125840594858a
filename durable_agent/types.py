"""The turn's data: what goes in, what comes out, and the steps in between.

Every model here crosses a Temporal boundary (workflow input, activity input or
result, query result), so each one is a pydantic model that can gain optional
fields later without breaking stored histories.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal, get_origin

from pydantic import (
    BaseModel,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from durable_agent.attachments import MAX_COUNT, Attachment
from durable_agent.elicitation import Question
from durable_agent.model_settings import ModelSettings
from durable_agent.principal import Principal, of_customer

DEFAULT_CUSTOMER = "demo"
"""Who a turn is for when its caller names nobody (the demo's sample data is theirs)."""

MAX_CUSTOMER_ID_CHARS = 500
"""A customer id's length, at most: room for the ids of identity providers (emails,
OIDC subjects), within a search attribute's 2 KB whatever the characters."""

MAX_STEPS = 10_000
"""The most rounds of tool calls a turn may be allowed (`TurnLimits.max_steps`)."""

MAX_QUESTION_CHARS = 4000
"""The question is sent with every model call and stored in every activity's
input, so a huge one would bloat the history of the whole turn."""

MAX_ATTACHMENTS = MAX_COUNT
"""Attachments one question may carry, at most (an agent may take fewer)."""

MAX_CONTEXT_BYTES = 16 * 1024
"""A turn's context (`TurnInput.context`), as compact JSON: it travels with the turn's
input and with every tool call's, so it is kept to what a prompt or a tool needs."""


class Tagged(BaseModel):
    """A member of a discriminated union (a message's `role`, an event's `type`): its
    tag is written even where fields holding their default are left out, as the
    project's payload converter leaves them (`durable_agent/runtime/codec.py`)."""

    @model_serializer(mode="wrap")
    def _with_tag(self, handler: SerializerFunctionWrapHandler) -> Any:
        tags = {name: getattr(self, name) for name in _tags(type(self))}
        return {**tags, **handler(self)}


@functools.cache
def _tags(cls: type[BaseModel]) -> tuple[str, ...]:
    return tuple(n for n, f in cls.model_fields.items() if get_origin(f.annotation) is Literal)


class ToolCall(BaseModel):
    """One call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    """Set by a backend when the model's call could not be decoded (e.g. its
    arguments were not JSON); parse then rejects the call with this text."""
    raw_arguments: str | None = None
    """The arguments exactly as the model wrote them, kept only when they could not
    be decoded: the conversation echoes the model's own words back to it."""

    def render(self) -> str:
        """`order_status(order_id='123456')`: how a call reads in logs and the Web UI."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        return f"{self.name}({args})"


class Observation(BaseModel):
    """What the model gets back for one call: compact text, never the raw payload."""

    call_id: str
    tool: str
    ok: bool
    text: str


class Usage(BaseModel):
    """Token usage of model calls (the offline model estimates it from word counts)."""

    model_calls: int = 0
    input_tokens: int = 0
    """All input tokens, cached ones included."""
    output_tokens: int = 0
    cached_input_tokens: int = 0
    """Input tokens the provider read from its prompt cache (billed at a discount)."""
    cache_write_tokens: int = 0
    """Input tokens the provider wrote to its prompt cache (billed at a premium, by
    Anthropic: its cache is written only where a request asks)."""
    cost_usd: float | None = None
    """What the calls cost in US dollars, priced by the worker as each call returned
    (`durable_agent/pricing.py`); None when a call's price is unknown (so the sum is too)."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            model_calls=self.model_calls + other.model_calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=None
            if self.cost_usd is None or other.cost_usd is None
            else self.cost_usd + other.cost_usd,
        )


class StepKind(str, Enum):
    PLAN = "plan"
    """`plan` picked tool calls (at the start of the turn, or to fix rejected calls)."""
    REJECTED = "rejected"
    """A call failed validation; its error goes back to the model as the call's result."""
    TOOL_CALL = "tool_call"
    """A validated call is being run."""
    OBSERVATION = "observation"
    """A tool's result (or failure), as compact text."""
    CONTINUE = "continue"
    """`interpret` read the results and asked for more tool calls: the next iteration."""
    APPROVAL = "approval"
    """A call waits for a person's consent before it runs."""
    DECISION = "decision"
    """A person approved or declined a call (or nobody did in time)."""
    QUESTION = "question"
    """An MCP server asked the person for input during a call; or the answer to it."""
    SAMPLE = "sample"
    """An MCP server's request for the agent's model during a call: served by a model
    call of its own, or refused (`durable_agent.sampling`)."""
    SHIELD = "shield"
    """A shield judged the question, a call, a tool result or the answer."""
    ANSWER = "answer"
    """The final answer."""
    LIMIT = "limit"
    """A cap (steps, time) or a failing model ended the turn."""
    FALLBACK = "fallback"
    """A model failed for good; the next model of the turn's list gets the request."""
    COMPACT = "compact"
    """The conversation filled the model's context window: older exchanges were
    summarised by a model call (`durable_agent.compaction`)."""
    RECORDED = "recorded"
    """In a fork (`client.py rerun`): a call the original turn made too, answered by its
    recorded result instead of running (a write: already done, never done twice)."""
    CHANGED = "changed"
    """In a fork on the agent as served now (`rerun --current`): a call of the record
    whose tool was removed, or whose schema changed, since the original ran it."""
    RETRIEVE = "retrieve"
    """Before the loop: the passages of the agent's knowledge most relevant to the
    question, given to the model as a tool result (`activities/retrieve.py`)."""
    WAIT = "wait"
    """The turn waits on a durable timer, or for an event from outside, and says until
    when (`durable_agent.waits`); the wait's end is the call's observation."""


WAIVED = "waived"
"""`Consent.via` of a write that ran unasked: nobody decided, its consent was waived."""


class Consent(BaseModel):
    """The record of a decision on one call, as the turn took it: who decided, when,
    through which front end, and the hash of the exact call it covers. A turn's
    `decision` steps carry it; an approval covers that call of that turn only. The
    `tool_call` step of a write that ran unasked carries one too: approved, by no one,
    `via` `WAIVED`, so that the audit lists every write."""

    call_id: str
    tool: str
    call_hash: str
    """`approval.consent_hash` of the call: its tool and arguments, canonical."""
    approved: bool
    by: str
    principal: Principal | None = None
    via: str = ""
    at: datetime
    """When the turn took the decision (workflow time)."""
    reason: str = ""
    refused: str = ""
    """Why the turn refused the decision (the decider may not decide: the agent's
    approvers); empty for a decision taken."""


class Step(BaseModel):
    """One entry of the turn's story. The list only ever grows, so it doubles as
    the model's history and as what `client.py ask --follow` prints."""

    iteration: int = 1
    kind: StepKind
    text: str
    """One human-readable line."""
    calls: list[ToolCall] = Field(default_factory=list)
    observation: Observation | None = None
    model: str = ""
    """The model spec whose reply this step is, in a turn that names several models
    (fallback); empty otherwise."""
    settings: ModelSettings | None = None
    """The settings the model call whose reply this step is was given (its agent's, its
    model's and its turn's: `durable_agent.model_settings`); None when none was set."""
    settings_ignored: list[str] = Field(default_factory=list)
    """Of those, what the model's backend did not send (its API has no such parameter,
    or not in this request): the worker's log says why."""
    consent: Consent | None = None
    """A `decision` step: the record of the decision (who, when, through what, on which
    exact call); a `tool_call` step of a write that ran unasked: its waiver (`WAIVED`);
    None on other steps, and on steps recorded before it existed."""
    tool_schema: str = ""
    """A `tool_call` step: a hash of the schema of the call's tool as the turn was
    offered it (`rewind.schema_digest`), so that a fork on the agent as served now tells
    a changed tool (empty: not a call, or a turn recorded before steps held it)."""

    def render(self) -> str:
        return f"[{self.iteration}] {self.kind.value:<11} {self.text}{self._settings_line()}"

    def _settings_line(self) -> str:
        if self.settings is None:
            return ""
        ignored = f"; ignored: {', '.join(self.settings_ignored)}" if self.settings_ignored else ""
        return f"  (settings: {self.settings.line()}{ignored})"

    # Most lines only say what the step holds: an observation's is `tool: text`, a
    # step of calls lists them as they read. A stored payload (context LEAN,
    # `durable_agent/runtime/codec.py`) leaves such a line out, and a reader gets it
    # back from what the step holds.
    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if not self.tool_schema:  # most steps are no calls: they read as before it existed
            data.pop("tool_schema", None)
        lean = isinstance(info.context, dict) and info.context.get(LEAN)
        if lean and self.text == _line(self.observation, self.calls):
            del data["text"]
        return data

    @model_validator(mode="before")
    @classmethod
    def _line_of_its_content(cls, data: Any) -> Any:
        if isinstance(data, dict) and "text" not in data:
            observation = data.get("observation")
            calls = data.get("calls") or []
            line = _line(
                observation and Observation.model_validate(observation),
                [ToolCall.model_validate(c) for c in calls],
            )
            return {**data, "text": line} if line is not None else data
        return data


LEAN = "lean"
"""Serialization context key: the payload being written is stored (history, results),
so what a reader can rebuild is left out."""


def _line(observation: Observation | None, calls: list[ToolCall]) -> str | None:
    """The line a step of this content reads as, when its line says no more."""
    if observation is not None:
        return f"{observation.tool}: {observation.text}"
    if calls:
        return ", ".join(c.render() for c in calls)
    return None


class Outcome(str, Enum):
    ANSWERED = "answered"
    STEP_LIMIT = "step_limit"
    TIME_LIMIT = "time_limit"
    TOKEN_LIMIT = "token_limit"
    MODEL_ERROR = "model_error"
    REFUSED = "refused"
    """A shield stopped the question or the answer."""
    UNKNOWN_AGENT = "unknown_agent"
    """The turn names an agent its worker does not serve, or a version of its tools the
    worker cannot get (`ToolListUnavailable`)."""
    INVALID_OUTPUT = "invalid_output"
    """The turn asked for a typed output and the model gave no value that fits, within
    `max_replans` repairs (`durable_agent/outputs.py`)."""
    COST_LIMIT = "cost_limit"
    """The turn's spending cap (`TurnLimits.max_cost`) was reached, or it could not be
    kept: a model of the turn has no known price."""
    BUDGET_LIMIT = "budget_limit"
    """A model call would pass a spending budget of the turn's tenant or user, per day or
    month (`durable_agent.budgets`); the answer names the budget and when it resets."""
    PAYLOAD_UNAVAILABLE = "payload_unavailable"
    """A payload of the turn's record could not be read or written: missing from the
    payload store, altered there, or refused by it (`durable_agent.errors.PayloadUnavailable`;
    its step says which payload, which store, and what to do)."""


class OutputSpec(BaseModel):
    """A turn's output type as it travels: the type's JSON schema and name
    (`durable_agent.outputs.output_spec(SomeType)`)."""

    name: str
    """The type's name ("Slot"): the schema's name where a provider asks for one."""
    json_schema: dict[str, Any]
    """The type's JSON schema, as pydantic's `TypeAdapter(...).json_schema()` gives it."""
    python: str = ""
    """An agent's own type, when it is a class defined at a module's top level: where,
    as `module:qualname` (`durable_agent.outputs.type_path`), so that a client that has
    loaded that module gives the turn's value as an object of it. Empty otherwise."""

    @property
    def wrapped(self) -> bool:
        """Not an object (a list, a scalar): the model gives it as `result` of one."""
        return self.json_schema.get("type") != "object"


class TurnLimits(BaseModel):
    """Caps the workflow enforces. At a cap the turn ends with a graceful answer."""

    max_steps: int = Field(default=10, ge=1, le=MAX_STEPS)
    """Rounds of tool calls (parse → dispatch → interpret) before the
    turn gives up; a turn of N rounds costs N + 1 model calls. A long turn's history
    stays within Temporal's limits: it continues as new when it nears them
    (`continue_after_events`, `continue_after_bytes`, or Temporal's suggestion)."""
    max_duration: timedelta = Field(
        default=timedelta(seconds=120), gt=timedelta(0), le=timedelta(days=7)
    )
    """Wall time of the whole turn: every activity is given at most the time left
    (its schedule-to-close timeout), so the one running when it is up stops then."""
    max_replans: int = Field(default=2, ge=0, le=10)
    """How often per iteration the model may fix its calls when every one of them
    failed validation (nothing could run); then the errors go to interpret."""
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000_000)
    """Token budget (input + output, as the model reports it); none by default."""
    approval_timeout: timedelta = Field(
        default=timedelta(hours=24), gt=timedelta(0), le=timedelta(days=365)
    )
    """How long a call that needs consent waits for a decision; then it is not run.
    Time spent waiting does not count towards `max_duration`."""
    continue_after_events: int = Field(default=10_000, ge=10, le=50_000)
    """A run of the turn whose history holds this many events continues as new at its
    next safe point (between rounds, or while every call of a round waits for a
    person), as it does when Temporal suggests it. Temporal warns at 10,240 events and
    ends a workflow at 51,200."""
    continue_after_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=40 * 1024 * 1024)
    """The same for the history's size in bytes (Temporal warns at 10 MB, ends at 50 MB)."""
    max_cost: float | None = Field(default=None, ge=0, le=1_000_000)
    """Spending cap in US dollars (model calls, priced by `durable_agent.pricing`),
    checked before each model call; none by default. A turn with a cap whose models'
    prices are unknown is refused before its first call: never silently uncapped."""
    max_wait: timedelta = Field(default=timedelta(days=7), gt=timedelta(0), le=timedelta(days=365))
    """The longest one `wait` or `wait_for_event` call may wait (`durable_agent.waits`):
    a call asking for longer is refused, and the model reads why. A wait is wall-clock
    time bounded by this cap alone: like a wait for consent, it does not count towards
    `max_duration`, which is for the turn's work."""


class AgentInfo(BaseModel):
    """Who answers a turn, as its worker resolved the agent the turn names."""

    name: str
    fingerprint: str = ""
    """A short hash of the agent's instructions and tool schemas (`Agent.fingerprint`)."""
    tools_version: str = ""
    """For an agent whose tools may change while its worker runs (an MCP server's): the
    version of its tools the turn started with, which every step of the turn uses (its
    fingerprint then). Empty: the agent's tools never change under a worker."""
    tool_lists: dict[str, str] = {}
    """With `tools_version`: the hash of what each MCP server (by name) listed for that
    version (each tool's name, description, input schema and read/write hints). The
    lists are kept by these hashes in the tool-list store, not in the turn's history
    (`durable_agent/runtime/tool_lists.py`): a worker that never saw that version
    (started since, or after a crash) reads them there and serves the turn with them."""
    offered: dict[str, list[dict[str, Any]]] = {}
    """The lists themselves, as turns recorded them before they were kept by hash
    (`tool_lists`); a turn records none now."""
    limits: TurnLimits | None = None
    """The agent's limits, for a turn that names none."""
    unknown_outcomes: Literal["ask", "model"] = "ask"
    """Who hears of a write whose outcome is unknown (`Agent.unknown_outcomes`)."""
    output: OutputSpec | None = None
    """The agent's output type (`Agent.output_type`): its turns end with a value of it."""
    models: list[str] = []
    """The agent's model specs, in order (`Agent.model`), when it names more than one:
    the next gets a request the one before failed for good (fallback)."""
    model_calls: Literal["activity", "local"] = "activity"
    """How the turn calls the model (`Agent.model_calls`): `local` runs each call as a
    local activity, whose record (its marker) carries what the call was sent."""
    dynamic_instructions: bool = False
    """The agent's instructions are a function of the turn's context: the turn has them
    evaluated once, first (`activities/instructions.py`), and its fingerprint covers
    the text it got."""
    retrieve: int = 0
    """How many passages of its knowledge the turn's retrieval step gives the model
    before the loop (`Agent.knowledge`, `activities/retrieve.py`); 0: no such step."""


class Exchange(BaseModel):
    """An earlier question of the same conversation and the answer it got."""

    question: str
    answer: str
    attachments: list[Attachment] = Field(default_factory=list, max_length=MAX_ATTACHMENTS)
    """The question's files, by reference (the conversation's payloads): a later turn's
    model sees them where they were sent."""


class TurnInput(BaseModel):
    """Input of one agent turn (the `AgentTurn` workflow)."""

    question: str
    customer_id: str = DEFAULT_CUSTOMER
    """Trusted: set by the caller, handed to tools, never taken from the model."""
    agent: str = ""
    """The agent that answers, by name; empty: the worker's first. The worker resolves
    its instructions, tools and policies by this name: nothing of them is in here."""
    model: str = ""
    """Model spec (`offline`, `openai:<model>`, `bedrock:<id>`, `sagemaker:<endpoint>`),
    resolved by the worker; empty: the agent's default, else the worker's (`AGENT_MODEL`)."""
    limits: TurnLimits | None = None
    """Exactly these limits; None: the agent's (`Agent.limits`)."""
    history: list[Exchange] = Field(default_factory=list)
    """Earlier exchanges of the conversation this turn belongs to (bounded by the
    conversation), given to the model before the question."""
    conversation_id: str = ""
    """The conversation workflow this turn answers a message of, if any."""
    tools: list[str] | None = None
    """Only these of the agent's tools (sub-agent turns recorded before agents were
    named; new ones name their agent)."""
    instructions: str = ""
    """Other instructions than the agent's (as `tools`)."""
    stream: bool = False
    """Publish the models' text to the turn's stream as they write it (for a reader
    that shows the answer typing itself out). Steps are always on the stream."""
    said: list[str] | None = None
    """The customer's own words, when the question is not (a sub-agent's turn, asked
    by its parent's model): writes are checked against these (`provenance`)."""
    output: OutputSpec | None = None
    """The turn's own output type (its JSON schema); None: the agent's, if it has one,
    else text (`durable_agent/outputs.py`)."""
    carry: dict[str, Any] | None = None
    """Set by the turn itself when it continues as new: where its previous run left off
    (`durable_agent/workflows/carry.py`). A caller never sets it."""
    context: dict[str, Any] = Field(default_factory=dict)
    """Trusted, from the caller: a JSON object about who asks and where (name, plan,
    locale, tenant, today's date), at most `MAX_CONTEXT_BYTES`. Tools read it as
    `ctx.context`; instructions given as a function get it; sub-agents get it too."""
    cost_left: float | None = None
    """What is left of a conversation's spending cap (`ConversationInput.max_cost`):
    the turn stops there too, whatever its own limits say."""
    fork: Fork | None = None
    """This turn is a fork of another from one of its steps (`durable_agent/rewind.py`):
    it starts from that turn's conversation there, and the calls that turn ran answer
    with their recorded results."""
    settings: ModelSettings | None = None
    """How its models are asked (temperature, output limit, ...), over its agent's and
    its models' own, field by field (`durable_agent.model_settings`); None: theirs."""
    attachments: list[Attachment] = Field(default_factory=list, max_length=MAX_ATTACHMENTS)
    """Files and images of the question, by reference to the payload store (the bytes
    never travel with the turn: `durable_agent/attachments.py`)."""
    principal: Principal | None = None
    """Trusted, from the caller's authentication: who asks (`durable_agent.Principal`).
    None: `customer_id`, as the user of the default tenant (`asker`). Given, its user
    is the turn's `customer_id`."""

    @property
    def asker(self) -> Principal:
        """Who asks: the principal given, else the customer in the default tenant."""
        return self.principal if self.principal is not None else of_customer(self.customer_id)

    @model_validator(mode="after")
    def _customer_is_user(self) -> TurnInput:
        if self.principal is not None:
            if "customer_id" in self.model_fields_set and self.customer_id != self.principal.user:
                raise ValueError(
                    "give a customer or a principal, not both: the customer is the principal's user"
                )
            self.customer_id = self.principal.user
        return self

    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        return check_question(v)

    @field_validator("customer_id")
    @classmethod
    def _customer_id_shape(cls, v: str) -> str:
        return check_customer_id(v)

    @field_validator("context")
    @classmethod
    def _context_shape(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_context(v)


def check_context(v: Any) -> dict[str, Any]:
    """A turn's context as it travels: a JSON object of at most `MAX_CONTEXT_BYTES`;
    ValueError, saying which, otherwise."""
    if not isinstance(v, dict):
        raise ValueError(f"the context must be a JSON object, not {type(v).__name__}")
    try:
        size = len(json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"the context must be JSON data (strings, numbers, lists, objects): {e}"
        ) from None
    if size > MAX_CONTEXT_BYTES:
        raise ValueError(
            f"the context is too large ({size:,} bytes of JSON; at most {MAX_CONTEXT_BYTES:,}): "
            "give what a prompt or a tool needs, and let tools look the rest up"
        )
    return v


def check_customer_id(v: str) -> str:
    """A customer id as tools get it, matched whole: 1 to `MAX_CUSTOMER_ID_CHARS`
    characters of text, any (`-`, `/`, `%`, spaces, any script: workflow ids carry it
    escaped, `runtime.turns.workflow_id`), but no control or invisible character (a
    newline, U+200B, U+202E) and no space at either end, which would make two ids
    look one; ValueError otherwise."""
    if (
        not isinstance(v, str)
        or not 0 < len(v) <= MAX_CUSTOMER_ID_CHARS
        or v != v.strip()
        or any(unicodedata.category(c) in _UNSEEN for c in v)
    ):
        raise ValueError(
            f"customer id must be 1-{MAX_CUSTOMER_ID_CHARS} characters of text, with no "
            "control or invisible characters and no space at either end"
        )
    return v


_UNSEEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Unicode categories that show nothing, or not what they are: controls, formats
(bidirectional marks, zero widths), surrogates, private use, unassigned, separators."""


def check_question(v: str) -> str:
    """A customer's question or message, stripped; refused (ValueError) if it is
    not text, empty, or too long to carry through every model call."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the question is not valid UTF-8 text") from None
    # A NUL or a terminal escape is no customer's word, and no model API or terminal
    # takes it as text: the message is refused, not stored in every model call.
    if bad := next((c for c in v if unicodedata.category(c) == "Cc" and c not in "\t\n\r"), None):
        raise ValueError(
            f"the question holds a control character ({ord(bad):#04x} at {v.index(bad) + 1}); "
            "send text only"
        )
    v = v.strip()
    if len(v) > MAX_QUESTION_CHARS:
        raise ValueError(
            f"the question is too long ({len(v)} characters; at most {MAX_QUESTION_CHARS})"
        )
    if not v:
        raise ValueError("the question is empty; ask something")
    return v


class TurnOutput(BaseModel):
    """Result of one agent turn."""

    answer: str
    outcome: Outcome
    steps: list[Step]
    usage: Usage
    agent: str = ""
    """The agent that answered (its name), once the worker resolved it."""
    fingerprint: str = ""
    """That agent's fingerprint (`Agent.fingerprint`): a changed agent shows."""
    output: Any = None
    """A typed turn's value, as JSON (its `answer` is that JSON's text); None for a
    turn that answered in words, or ended without a value."""
    output_type: str = ""
    """With a value of its agent's own type: where that type is defined, as its worker
    has it (`OutputSpec.python`, `module:qualname`); empty otherwise."""
    earlier_steps: int = 0
    """Steps the turn's earlier runs recorded (a turn that continued as new), which
    `steps` leaves out; each run's are in the input of the run after it
    (`AgentClient` puts them back: `durable_agent/runtime/turns.py`, `earlier_steps`)."""
    runs: int = 1
    """The runs the turn took (one more each time it continued as new)."""

    # The last step of an answered turn is its answer: stored (context LEAN), its
    # line is the answer's own, written once.
    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        lean = isinstance(info.context, dict) and info.context.get(LEAN)
        if lean and self.steps and _is_answer(self.steps[-1], self.answer):
            data["steps"][-1].pop("text", None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _answer_step(cls, data: Any) -> Any:
        steps = (data.get("steps") if isinstance(data, dict) else None) or []
        last = steps[-1] if steps else None
        if isinstance(last, dict) and "text" not in last and last.get("kind") == "answer":
            return {**data, "steps": [*steps[:-1], {**last, "text": data.get("answer", "")}]}
        return data


def _is_answer(step: Step, answer: str) -> bool:
    return step.kind is StepKind.ANSWER and step.text == answer and not step.calls


class PendingApproval(BaseModel):
    """A call waiting for a person's decision."""

    call: ToolCall
    why: str
    """Why it needs consent, in words the person deciding can judge."""
    since: datetime
    """When the turn started waiting (workflow time)."""
    approvers: list[str] = []
    """Who may decide (`ApprovalPolicy.approvers`: `asker`, `role:NAME`); empty: anyone."""
    call_hash: str = ""
    """`approval.consent_hash` of the call: what a decision on it attests to."""


class TurnProgress(BaseModel):
    """What the `progress` query returns while (and after) a turn runs."""

    steps: list[Step]
    usage: Usage
    done: bool = False
    pending: list[PendingApproval] = Field(default_factory=list)
    """Calls waiting for a decision (the turn's `decide` update)."""
    questions: list[Question] = Field(default_factory=list)
    """MCP servers' questions waiting for a person's answer (the `answer` update)."""
    earlier_steps: int = 0
    """Steps of the turn's earlier runs, which `steps` leaves out (`TurnOutput`)."""


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)


class RecordedCall(BaseModel):
    """A call a turn ran, and its result as recorded (`durable_agent/rewind.py`)."""

    call: ToolCall
    """As it ran: its arguments as the tool validated them, its id in that turn."""
    step: int
    """The step (iteration) it ran in."""
    ok: bool = True
    text: str | None = None
    """Its result as that turn's model read it; None: the model never read it (a
    return-direct result), and `result` is the tool's raw result."""
    result: Any = None
    tool_schema: str = ""
    """A hash of its tool's schema as that turn was offered it (`Step.tool_schema`;
    empty: not recorded)."""


class Fork(BaseModel):
    """What makes a turn a fork of another (`client.py rerun`): that turn's conversation
    before step `step`, and every call it ran with its result. Before `step` nothing
    runs again; from it on, this turn's model decides, and a call that turn ran is
    answered by its recorded result: a write always (it is never done twice), a read
    unless `live_reads`."""

    parent: str
    """The workflow id of the turn forked."""
    step: int = Field(ge=1)
    messages: list[dict[str, Any]]
    """The conversation before step `step`, as JSON (`durable_agent.conversation.Message`:
    this module comes before that one)."""
    steps: list[Step] = Field(default_factory=list)
    """The parent's steps before `step`, which begin this turn's story."""
    calls: list[RecordedCall] = Field(default_factory=list)
    fingerprint: str = ""
    """The parent's agent fingerprint: a fork runs the same agent, or not at all (unless
    `current`)."""
    instructions: str = ""
    """The instructions the parent's agent function gave it (`Agent(instructions=fn)`),
    as its history records them: the fork's too, so that it runs the text the parent
    ran, unless it is given other instructions or runs on the agent as served now.
    Empty: the parent's agent had plain instructions."""
    current: bool = False
    """Run on the agent as served now (`rerun --current`), however it changed since the
    parent ran: its instructions (a function's evaluated again, from the parent's
    context) and its tools, with no fingerprint check. The record's calls whose tools
    were removed, or whose schemas changed, are reported, each in a `changed` step."""
    live_reads: bool = False
    """Reads run again, live, instead of answering with their recorded results (those
    before `step` too: their new results replace the recorded ones)."""
    in_order: bool = False
    """A replay (`client.py replay`): the calls are served from the record while they
    repeat the parent's in order; from the first that does not, reads run live."""
    own_world: bool = False
    """A replay in a world of its own (a fresh copy of the one the parent ran in, as an
    evaluation has): from the first call that differs, every call runs live there,
    writes too (the parent's world is never touched), and each is told how many of the
    recording's calls came before it from the record (`ToolContext.followed`)."""


TurnInput.model_rebuild()
