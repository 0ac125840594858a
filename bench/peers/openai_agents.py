"""The OpenAI Agents SDK doing the benchmark's turns, through Temporal's integration.

Set up as the integration's documentation shows: `OpenAIAgentsPlugin` on the client
(each model call becomes an activity), the agent built in the workflow, and the tools
as activities wrapped with `activity_as_tool`. The model provider hands out a
`ScriptedModel` per task of `bench.models.TASKS`: the agent's model name is the task.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from agents import (
        Agent,
        AgentOutputSchemaBase,
        Handoff,
        Model,
        ModelProvider,
        ModelResponse,
        ModelSettings,
        ModelTracing,
        Runner,
        Tool,
        TResponseInputItem,
        Usage,
    )
    from agents.items import TResponseOutputItem, TResponseStreamEvent
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

    from durable_agent.bench.peers import PeerTurnInput, PeerTurnOutput, script, shop
    from durable_agent.shop.store import Order, Return
    from durable_agent.types import ToolCall

TOOL_TIMEOUT = timedelta(seconds=5)
"""As the agent's shop tools declare."""
MODEL_TIMEOUT = timedelta(seconds=60)
"""The integration's default for its own model provider; a custom one must set it."""


@activity.defn(name="order_status")
def order_status(order_id: str) -> Order:
    """Status of a specific order: the item purchased, quantity, amount, and shipping
    status and delivery dates."""
    return shop.order(order_id)


@activity.defn(name="return_status")
def return_status(return_id: str) -> Return:
    """Status of a specific return: whether it is pending, received, processed or
    refunded."""
    return shop.return_(return_id)


class ScriptedModel(Model):
    """Asks for one task's rounds of calls, then answers with the results."""

    def __init__(self, task: str) -> None:
        self.task = task

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        **kwargs: Any,
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else input
        results = [
            str(_field(i, "output")) for i in items if _field(i, "type") == "function_call_output"
        ]
        calls = script.next_calls(self.task, len(results))
        output: list[TResponseOutputItem]
        if calls:
            output = [_call(c, f"call-{len(results)}-{n}") for n, c in enumerate(calls)]
        else:
            output = [_message(script.answer(self.task, results))]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the benchmark's turns do not stream")


class ScriptedModels(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return ScriptedModel(model_name or "one tool")


@workflow.defn(name="OpenAIAgentsTurn")
class OpenAIAgentsTurn:
    @workflow.run
    async def run(self, turn: PeerTurnInput) -> PeerTurnOutput:
        agent: Agent[None] = Agent(
            name="Shop support",
            instructions="Answer the customer's question about their order or return.",
            model=turn.task,
            tools=[
                activity_as_tool(order_status, start_to_close_timeout=TOOL_TIMEOUT),
                activity_as_tool(return_status, start_to_close_timeout=TOOL_TIMEOUT),
            ],
        )
        result = await Runner.run(agent, turn.question)
        return PeerTurnOutput(answer=str(result.final_output))


async def build_worker(address: str, task_queue: str) -> Worker:
    # The SDK would otherwise send its traces to OpenAI's tracing service.
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=MODEL_TIMEOUT),
        model_provider=ScriptedModels(),
    )
    client = await Client.connect(address, plugins=[plugin])
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[OpenAIAgentsTurn],
        activities=[order_status, return_status],
        # The tools are plain (blocking) functions, run in threads as the agent's are.
        activity_executor=ThreadPoolExecutor(max_workers=100),
    )


def _field(item: Any, name: str) -> Any:
    """A field of an input item, which arrives as a dict or as a model object."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _call(call: ToolCall, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call",
        call_id=call_id,
        name=call.name,
        arguments=json.dumps(call.arguments),
        status="completed",
    )


def _message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="answer",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )
