"""interpret: given the observations, the model answers or asks a next question."""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from activities._common import heartbeating, inject, server_suggested_delay
from agent.errors import ModelUnavailable
from agent.faults import Faults
from agent.model import Decision, ModelCatalog, ModelRequest
from agent.telemetry import model_span, record_usage
from agent.tools import ToolRegistry
from agent.types import Step


class InterpretInput(BaseModel):
    model: str
    question: str
    steps: list[Step] = Field(default_factory=list)


class InterpretOutput(BaseModel):
    decision: Decision


class InterpretActivity:
    def __init__(self, models: ModelCatalog, tools: ToolRegistry, faults: Faults) -> None:
        self._models = models
        self._tools = tools
        self._faults = faults

    @activity.defn(name="interpret")
    async def interpret(self, input: InterpretInput) -> InterpretOutput:
        model = self._models.resolve(input.model)
        request = ModelRequest(question=input.question, steps=input.steps, tools=self._tools.specs)
        await inject(self._faults, ModelUnavailable, "interpret")
        async with heartbeating():
            with (
                model_span("interpret", model.system, model.name) as span,
                server_suggested_delay(),
            ):
                decision = await model.interpret(request)
                record_usage(span, decision.usage)
        return InterpretOutput(decision=decision)
