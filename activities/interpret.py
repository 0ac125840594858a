"""interpret: given the tool results, the model answers, or asks for the next calls.

Next calls run in the turn's next iteration straight away (parse → dispatch →
interpret), without asking `plan` again: a task of N sequential
rounds of tools costs N + 1 model calls.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from durable_agent.activities._conversation import Sent
from durable_agent.activities._model_call import ModelCaller, ModelCallInput
from durable_agent.activities.parse import ParseOutput
from durable_agent.model import Reply


class InterpretInput(ModelCallInput):
    pass


class InterpretOutput(BaseModel):
    decision: Reply
    """The answer (no calls), or the next calls."""
    sent: Sent | None = None
    """What the call was sent, when it ran as a local activity (`ModelCallInput.sent`)."""
    parsed: ParseOutput | None = None
    """Its calls parsed, when the input asked (`ModelCallInput.parse`) and parse ran here."""


class InterpretActivity(ModelCaller):
    @activity.defn(name="interpret")
    async def interpret(self, input: InterpretInput) -> InterpretOutput:
        reply, parsed = await self.call(input, "interpret")
        return InterpretOutput(decision=reply, sent=input.sent(), parsed=parsed)
