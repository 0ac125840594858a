"""Pydantic AI's durable agent doing the benchmark's turns.

An `Agent` with the `TemporalDurability` capability (Pydantic AI's durable agent; it
replaces the deprecated `TemporalAgent` wrapper and runs the same activities: each
model request and each tool call a regular activity), set up as its documentation
shows: the agent at module level, a workflow listing it in `__pydantic_ai_agents__`,
and `PydanticAIPlugin` on the client. The model is a `FunctionModel` per task of
`bench.models.TASKS`, registered under the task's name, so a turn picks its script
with `run(model=task)`.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import (
        PydanticAIPlugin,
        PydanticAIWorkflow,
        TemporalDurability,
    )
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from durable_agent.bench.models import TASKS
    from durable_agent.bench.peers import PeerTurnInput, PeerTurnOutput, script, shop
    from durable_agent.shop.store import Order, Return


def order_status(order_id: str) -> Order:
    """Status of a specific order: the item purchased, quantity, amount, and shipping
    status and delivery dates."""
    return shop.order(order_id)


def return_status(return_id: str) -> Return:
    """Status of a specific return: whether it is pending, received, processed or
    refunded."""
    return shop.return_(return_id)


def scripted(task: str) -> FunctionModel:
    """A model that asks for `task`'s rounds of calls, then answers with the results."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [
            part.model_response_str()
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        calls = script.next_calls(task, len(results))
        if calls:
            return ModelResponse(parts=[ToolCallPart(c.name, c.arguments) for c in calls])
        return ModelResponse(parts=[TextPart(script.answer(task, results))])

    return FunctionModel(reply, model_name=f"scripted-{task.replace(' ', '-')}")


agent = Agent(
    scripted("one tool"),
    name="shop_support",
    instructions="Answer the customer's question about their order or return.",
    tools=[order_status, return_status],
    capabilities=[TemporalDurability(models={task: scripted(task) for task in TASKS})],
)


@workflow.defn(name="PydanticAITurn")
class PydanticAITurn(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, turn: PeerTurnInput) -> PeerTurnOutput:
        result = await agent.run(turn.question, model=turn.task)
        return PeerTurnOutput(answer=result.output)


async def build_worker(address: str, task_queue: str) -> Worker:
    client = await Client.connect(address, plugins=[PydanticAIPlugin()])
    return Worker(client, task_queue=task_queue, workflows=[PydanticAITurn])
