"""Models for tests of your own agent: `TestModel` and `FunctionModel`.

    TestModel()                            each offered tool called once, with arguments
                                           valid for its schema; then an answer
    TestModel(call_tools=["ticket_status"], text="All fine.")
    FunctionModel(reply)                   `reply(request) -> Reply | str`, sync or async

Neither keeps anything between calls: their slots hold their options, nothing else. A
worker builds a model once and every turn it runs shares that one object (`ModelCatalog`
caches backends by spec), concurrently: what a model kept from one call would reach
another turn's call. So each reply is a function of the request alone — the
conversation of that turn and the tools it offers — and a reply given is a fresh copy
(the model-call activity names its calls in place). `durable_agent.scripted.ScriptedModel`,
which pops replies from queues, is the project's own fake for its own tests; these two
are the ones for yours.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Union

from pydantic_core import to_jsonable_python

from durable_agent.conversation import AssistantMessage, ToolResult
from durable_agent.model import ModelRequest, Reply
from durable_agent.outputs import OUTPUT_TOOL, WRAPPER
from durable_agent.stream import TextSink, write_out
from durable_agent.testing._values import CannotMake, arguments_for, first_problem, value_for
from durable_agent.tools import ToolSpec
from durable_agent.types import ToolCall

log = logging.getLogger("durable_agent.testing")

ReplyFunction = Callable[[ModelRequest], Union[Reply, str, Awaitable[Union[Reply, str]]]]  # noqa: UP007 - a runtime alias on 3.10
"""`reply(request) -> Reply | str`, sync or async: a `FunctionModel`'s function."""


@dataclass(slots=True)
class TestModel:
    """Calls each tool the turn offers once, in one round, with arguments made from its
    JSON schema (`durable_agent.testing.arguments_for`: a value of a pattern or an enum
    is taken from the question when it holds one, as a model would); then answers:
    `text`, or each result it got as `tool: result` lines. In a typed turn it answers
    with `output`, or a value made from the output type's schema.

    `call_tools`: "all", or the names of the tools to call (none: `[]`). A tool whose
    arguments it cannot make valid is not called: the reply's text says which and why
    (`skipped open_ticket: cannot make title: ...`), and so does the worker's log.
    `seed` picks other enum members and union options. Its slots are its options: it
    has nowhere to keep anything else."""

    __test__: ClassVar[bool] = False  # not a test class, whatever pytest thinks of the name

    call_tools: Literal["all"] | Sequence[str] = "all"
    text: str | None = None
    output: Any = None
    seed: int = 0
    name: str = "test"
    provider: str = field(default="test", init=False)

    def __post_init__(self) -> None:
        if isinstance(self.call_tools, str) and self.call_tools != "all":
            raise TypeError(
                f"TestModel(call_tools={self.call_tools!r}): give 'all' or a list of tool "
                f"names, e.g. call_tools=[{self.call_tools!r}]"
            )

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await self._reply(request, stream)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await self._reply(request, stream)

    async def _reply(self, request: ModelRequest, stream: TextSink | None) -> Reply:
        offered = [t for t in request.tools if t.name not in (OUTPUT_TOOL, request.final_tool)]
        notes: list[str] = []
        if not _tools_called(request):
            calls, notes = self._calls(offered, request.question)
            if calls:
                return Reply(text="\n".join(notes), calls=calls)
        if request.final_tool or request.output is not None:
            return self._value(request, notes)
        text = self.text if self.text is not None else _results(request, notes)
        await write_out(text, stream, per_word_s=0)
        return Reply(text=text)

    def _calls(self, offered: list[ToolSpec], text: str) -> tuple[list[ToolCall], list[str]]:
        wanted = [t.name for t in offered] if self.call_tools == "all" else list(self.call_tools)
        by_name = {t.name: t for t in offered}
        calls, notes = [], []
        for name in wanted:
            spec = by_name.get(name)
            if spec is None:
                notes.append(f"skipped {name}: not offered to this turn")
                continue
            made = arguments_for(spec, self.seed, text)
            if made.values is None:
                notes.append(f"skipped {made.note}")
                continue
            calls.append(ToolCall(id=f"test_{name}", name=name, arguments=made.values))
        for note in notes:
            log.warning("TestModel %s", note)
        return calls, notes

    def _value(self, request: ModelRequest, notes: list[str]) -> Reply:
        if self.output is not None:
            return typed_reply(request, self.output)
        schema = _output_schema(request)
        try:
            made = value_for(schema, seed=self.seed, text=request.question)
            return _as_value(request, made)
        except CannotMake as e:
            note = f"cannot make the output value: {e}"
            log.warning("TestModel %s", note)
            return Reply(text="\n".join([*notes, note]))


def _tools_called(request: ModelRequest) -> bool:
    """Whether this turn's conversation has the model's tool calls in it already (not
    the output tool's: a value given, refused and asked for again is no round of tools)."""
    return any(
        isinstance(m, AssistantMessage) and any(c.name != OUTPUT_TOOL for c in m.calls)
        for m in request.messages
    )


def _results(request: ModelRequest, notes: list[str]) -> str:
    """`tool: result` for each result of the turn, then the notes."""
    said = [f"{m.tool}: {m.text}" for m in request.messages if isinstance(m, ToolResult)]
    return "\n".join([*said, *notes]) or "no tools called"


@dataclass(slots=True)
class FunctionModel:
    """A model whose every reply is `function(request)`: the request holds the turn's
    conversation so far (`request.messages`: `UserMessage`, `AssistantMessage`,
    `ToolResult`), the tools it offers (`request.tools`) and, in a typed turn, how the
    value is asked for (`typed_reply` answers it). Return a `Reply` (text, or tool
    calls), or a `str` (the answer). Sync or async.

    The function gets a copy of the request, and its reply is copied: nothing it
    returns is shared between calls. It decides from the conversation alone — a
    counter or a queue in its closure would be shared by every turn the worker runs,
    at once. Its slots are its function and name: it has nowhere to keep anything."""

    function: ReplyFunction
    name: str = ""
    provider: str = field(default="function", init=False)

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise TypeError(
                f"FunctionModel: give a function (request) -> Reply, not "
                f"{type(self.function).__name__}"
            )
        if not self.name:
            self.name = getattr(self.function, "__name__", "function")

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await self._reply(request, stream)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await self._reply(request, stream)

    async def _reply(self, request: ModelRequest, stream: TextSink | None) -> Reply:
        given = self.function(request.model_copy(deep=True))
        if inspect.isawaitable(given):
            given = await given
        if isinstance(given, str):
            reply = Reply(text=given)
        elif isinstance(given, Reply):
            reply = given.model_copy(deep=True)
        else:
            raise TypeError(
                f"FunctionModel {self.name}: its function returned {type(given).__name__}; "
                "return a Reply (text or calls), or the answer as a str"
            )
        if not reply.calls:
            await write_out(reply.text, stream, per_word_s=0)
        return reply


def typed_reply(request: ModelRequest, value: Any) -> Reply:
    """The reply that gives a typed turn its value, as this request asks for it: a call
    of the output tool, or the JSON text of a backend's native structured output.
    `value`: an object of the output type (a pydantic model, a dataclass, ...) or its
    JSON-shaped form; a list or a scalar is wrapped as the turn expects."""
    if not request.final_tool and request.output is None:
        raise TypeError(
            "typed_reply: this turn has no output type; give the agent one "
            "(Agent(output_type=...)) or ask with ask(..., output_type=...)"
        )
    return _as_value(request, to_jsonable_python(value))


def _as_value(request: ModelRequest, value: Any) -> Reply:
    schema = _output_schema(request)
    # The output type's own schema, unless it is wrapped (a list, a scalar): then the
    # value is the `result` of an object.
    if first_problem(schema, value) is not None and first_problem(schema, {WRAPPER: value}) is None:
        value = {WRAPPER: value}
    if request.output is not None:
        return Reply(text=json.dumps(value))
    return Reply(calls=[ToolCall(id="test_output", name=request.final_tool, arguments=value)])


def _output_schema(request: ModelRequest) -> dict[str, Any]:
    if request.output is not None:
        return request.output.json_schema
    for spec in request.tools:
        if spec.name == request.final_tool:
            return spec.parameters
    return {}
