"""plan: at the start of a turn, the model picks tool calls (or answers directly).

It runs again only when every call of a reply failed validation: the model
reads the errors as the calls' results and fixes its calls.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from durable_agent.activities._conversation import Sent
from durable_agent.activities._model_call import ModelCaller, ModelCallInput
from durable_agent.activities.parse import ParseOutput
from durable_agent.model import Reply


class PlanInput(ModelCallInput):
    pass


class PlanOutput(BaseModel):
    plan: Reply
    model: str = ""
    """The model spec the worker used: the turn's, or the worker's default."""
    sent: Sent | None = None
    """What the call was sent, when it ran as a local activity (`ModelCallInput.sent`)."""
    parsed: ParseOutput | None = None
    """Its calls parsed, when the input asked (`ModelCallInput.parse`) and parse ran here."""


class PlanActivity(ModelCaller):
    @activity.defn(name="plan")
    async def plan(self, input: PlanInput) -> PlanOutput:
        reply, parsed = await self.call(input, "plan")
        return PlanOutput(plan=reply, model=self.spec(input), sent=input.sent(), parsed=parsed)
