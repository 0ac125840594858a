"""The model interface: the two questions the turn asks a model.

    plan(request)      -> Reply   at the start: which tools to call (or answer directly);
                                  again only to fix calls that all failed validation
    interpret(request) -> Reply   given the tool results: the final answer, or the
                                  next tool calls (which the turn runs without
                                  asking `plan` again)

Both get the same `ModelRequest`: the conversation so far and the tool specs,
and may get a `TextSink` (`stream`): a backend that can stream writes its text there as it
comes (the reply is still the whole message; one that cannot just ignores it).
Chat backends answer both the same way (one request, one system prompt);
prompt-based backends (text completion) keep a prompt for each. A backend
implements `Model`; the worker resolves a turn's model spec (`offline`,
`openai:<model>`, ...) through a `ModelCatalog`. Backends raise
`ModelUnavailable` for transient trouble, which Temporal retries, and other
`ModelError`s for trouble a retry will not fix.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from pydantic import BaseModel, Field

from durable_agent.attachments import Attachment
from durable_agent.conversation import AssistantMessage, Message, Opaque, question
from durable_agent.errors import UnknownModel
from durable_agent.model_settings import ModelSettings
from durable_agent.stream import TextSink
from durable_agent.tools import ToolSpec
from durable_agent.types import OutputSpec, ToolCall, Usage


class ModelRequest(BaseModel):
    messages: list[Message]
    """The conversation so far (`agent.conversation`)."""
    tools: list[ToolSpec] = Field(default_factory=list)
    instructions: str = ""
    """The agent's system prompt: chat backends send it first, unchanged on every call
    of a turn; the offline model reads its decline text from it."""
    output: OutputSpec | None = None
    """For a backend with native structured output (`native_output = True`): the
    strict object schema its reply's text must follow (`durable_agent/outputs.py`)."""
    final_tool: str = ""
    """A tool among `tools` the model must end its turn by calling (the output tool):
    a backend that can make the model call a tool does (Bedrock's `toolChoice`)."""
    settings: ModelSettings | None = None
    """How to ask (temperature, output limit, ...): the agent's, the model's and the
    turn's, merged (`durable_agent.model_settings`). A backend sends what its API takes,
    under the API's names, and says what it does not (`Model.unsupported_settings`)."""
    files: dict[str, bytes] = Field(default_factory=dict, exclude=True, repr=False)
    """The bytes of the conversation's attachments, by their sha256, read from the
    payload store by the model activity (`attached`); never serialized."""

    def attached(self, attachment: Attachment) -> bytes:
        """An attachment's bytes, for a backend to send."""
        return self.files[attachment.sha256]

    @property
    def question(self) -> str:
        """The customer's latest words."""
        return question(self.messages)


class Reply(BaseModel):
    """What the model said: tool calls to run, or (when there are none) the answer."""

    text: str = ""
    """The answer when `calls` is empty, else whatever the model said alongside them."""
    calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str = Field(default="", exclude=True)
    """As the provider said it (`stop`, `tool_calls`, `end_turn`, ...), for the trace
    only: excluded from the payload, so it never enters the workflow history."""
    response_model: str = Field(default="", exclude=True)
    """The model that answered, when the provider names it (trace only)."""
    output: str | None = None
    """For a turn with an output type: the value the reply gave, validated, as JSON text
    (then `calls` is empty: the value ends the turn)."""
    output_error: str = ""
    """For a turn with an output type: why the value the reply gave does not fit (the
    model reads it and tries again: `durable_agent.outputs.repair`)."""
    opaque: Opaque | None = None
    """Parts of the message only its provider reads (Anthropic's signed thinking), kept
    with the message in the conversation and sent back to that provider unchanged."""
    context_full: bool = False
    """Set by the model-call activity: the conversation fills the model's context window
    even with older results shortened, so the turn summarises older exchanges before
    its next call (`durable_agent.compaction`)."""
    settings: ModelSettings | None = None
    """Set by the model-call activity: the settings the call was given (the step that
    records this reply shows them)."""
    settings_ignored: list[str] = Field(default_factory=list)
    """Set by the model-call activity: those of `settings` the backend did not send."""

    def message(self) -> AssistantMessage:
        """The reply as it goes back into the conversation."""
        return AssistantMessage(text=self.text, calls=self.calls, opaque=self.opaque)


class Model(Protocol):
    """A backend. Besides these, it may declare `context_window` (tokens), which the
    turn keeps its conversation within (`durable_agent.compaction`), a method
    `summarise(request) -> Reply` that writes the summary compaction asks for (else
    `interpret` is asked it, with no tools), and a method
    `unsupported_settings(request) -> dict[str, str]`: which of `request.settings` it
    does not send, and why (a model without it is taken to send none of them)."""

    provider: str
    """Provider name, reported as `gen_ai.provider.name` (e.g. `openai`, `aws.bedrock`)."""
    name: str
    """Model id, reported as `gen_ai.request.model`."""

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply: ...

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply: ...


ModelFactory = Callable[[str], Model]
"""Builds a model from the part of the spec after `kind:` (empty for `offline`)."""


class ModelCatalog:
    """Model specs (`kind` or `kind:argument`) to backends, built once per worker."""

    def __init__(
        self,
        factories: Mapping[str, ModelFactory],
        default: str = "offline",
        base: ModelCatalog | None = None,
    ) -> None:
        self._factories = dict(factories)
        self._cache: dict[str, Model] = {}
        self._building = threading.RLock()
        self._base = base
        self.default = default
        """The spec a turn gets when it names none."""

    def layered(self, factories: Mapping[str, ModelFactory], default: str) -> ModelCatalog:
        """This catalog with `factories` added or replacing kinds (an agent's own
        models), and its own default; backends of the other kinds stay shared."""
        if not factories and default == self.default:
            return self
        return ModelCatalog(factories, default=default, base=self)

    @property
    def kinds(self) -> list[str]:
        inherited = self._base.kinds if self._base else []
        return sorted({*inherited, *self._factories})

    def resolve(self, spec: str) -> Model:
        spec = spec or self.default
        kind, _, arg = spec.partition(":")
        factory = self._factories.get(kind)
        if factory is None:
            if self._base is not None:
                return self._base.resolve(spec)
            raise UnknownModel(spec, self.kinds)
        with self._building:  # once, however many calls ask for it first at once
            if spec not in self._cache:
                self._cache[spec] = factory(arg)
            return self._cache[spec]

    async def get(self, spec: str) -> Model:
        """`resolve`, with a backend that is not built yet built in a thread: its factory
        imports its SDK and builds a client, which can take seconds on a busy machine,
        and must not hold up the worker's event loop meanwhile (an activity's heartbeats
        stop, its attempt times out and runs again, and a request is sent twice)."""
        built = self._built(spec or self.default)
        return built if built is not None else await asyncio.to_thread(self.resolve, spec)

    def _built(self, spec: str) -> Model | None:
        if spec in self._cache:
            return self._cache[spec]
        if spec.partition(":")[0] not in self._factories and self._base is not None:
            return self._base._built(spec)
        return None
