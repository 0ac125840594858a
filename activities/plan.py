"""plan: the model picks tool calls for the question (or answers directly)."""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from activities._common import heartbeating, inject, server_suggested_delay
from agent.errors import ModelUnavailable
from agent.faults import Faults
from agent.model import ModelCatalog, ModelRequest, Plan
from agent.telemetry import model_span, record_usage
from agent.tools import ToolRegistry
from agent.types import Step


class PlanInput(BaseModel):
    model: str
    question: str
    steps: list[Step] = Field(default_factory=list)


class PlanOutput(BaseModel):
    plan: Plan


class PlanActivity:
    def __init__(self, models: ModelCatalog, tools: ToolRegistry, faults: Faults) -> None:
        self._models = models
        self._tools = tools
        self._faults = faults

    @activity.defn(name="plan")
    async def plan(self, input: PlanInput) -> PlanOutput:
        model = self._models.resolve(input.model)
        request = ModelRequest(question=input.question, steps=input.steps, tools=self._tools.specs)
        await inject(self._faults, ModelUnavailable, "plan")
        async with heartbeating():
            with model_span("plan", model.system, model.name) as span, server_suggested_delay():
                plan = await model.plan(request)
                record_usage(span, plan.usage)
        # Backends may omit call ids; later steps and the history refer to calls by id.
        for i, call in enumerate(plan.calls, 1):
            call.id = call.id or f"call_{i}"
        return PlanOutput(plan=plan)
