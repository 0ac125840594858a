"""The model interface: the two questions the turn asks a model.

    plan(request)      -> Plan       which tools to call now (or a direct answer)
    interpret(request) -> Decision   given the observations: answer, or continue

A backend implements `Model` (two async methods and two names); the worker
resolves a turn's model spec (`offline`, later `bedrock:<id>`, ...) through a
`ModelCatalog`. Backends raise `ModelUnavailable` for transient trouble, which
Temporal retries, and other `ModelError`s for trouble a retry will not fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from pydantic import BaseModel, Field

from agent.errors import UnknownModel
from agent.tools import ToolSpec
from agent.types import Step, ToolCall, Usage


class ModelRequest(BaseModel):
    question: str
    """The user's question, verbatim."""
    steps: list[Step] = Field(default_factory=list)
    """The turn so far: plans, rejected calls, observations, decisions."""
    tools: list[ToolSpec] = Field(default_factory=list)


class Plan(BaseModel):
    """The model's next move: tool calls, or (when there are none) a direct answer."""

    calls: list[ToolCall] = Field(default_factory=list)
    text: str = ""
    """The direct answer when `calls` is empty, else the model's reasoning (may be empty)."""
    usage: Usage = Field(default_factory=Usage)


class Decision(BaseModel):
    """After the observations: the final answer, or a next question to work on."""

    final: bool
    text: str
    """The answer if `final`, else the next question for the planner."""
    usage: Usage = Field(default_factory=Usage)


class Model(Protocol):
    system: str
    """Provider name, reported as `gen_ai.system` (e.g. `offline`, `aws.bedrock`)."""
    name: str
    """Model id, reported as `gen_ai.request.model`."""

    async def plan(self, request: ModelRequest) -> Plan: ...

    async def interpret(self, request: ModelRequest) -> Decision: ...


ModelFactory = Callable[[str], Model]
"""Builds a model from the part of the spec after `kind:` (empty for `offline`)."""


class ModelCatalog:
    """Model specs (`kind` or `kind:argument`) to backends, built once per worker."""

    def __init__(self, factories: dict[str, ModelFactory], default: str = "offline") -> None:
        self._factories = dict(factories)
        self._cache: dict[str, Model] = {}
        self.default = default
        """The spec a turn gets when it names none."""

    def resolve(self, spec: str) -> Model:
        spec = spec or self.default
        if spec not in self._cache:
            kind, _, arg = spec.partition(":")
            factory = self._factories.get(kind)
            if factory is None:
                raise UnknownModel(spec, list(self._factories))
            self._cache[spec] = factory(arg)
        return self._cache[spec]
