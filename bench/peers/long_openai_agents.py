"""The OpenAI Agents SDK doing the long turn, through Temporal's integration.

Set up as `bench.peers.openai_agents` is (the integration's documented way): each
model call an activity through `OpenAIAgentsPlugin`, the document tool an activity
wrapped with `activity_as_tool`. Its scripted model makes the long turn's decisions
(`bench.long_script`) from the input items it is given.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
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
    from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin
    from temporalio.openai_agents.workflow import activity_as_tool

    from durable_agent.bench import long_script
    from durable_agent.bench.long_script import READ, Scenario
    from durable_agent.bench.peers import LongPeerInput, PeerTurnOutput
    from durable_agent.bench.peers.openai_agents import (
        MODEL_TIMEOUT,
        TOOL_TIMEOUT,
        _call,
        _field,
        _message,
    )
    from durable_agent.types import ToolCall

_scenario = Scenario(write_every=0)
"""The long turn in this worker (`build_worker`): the documents' number and size."""


@activity.defn(name=READ)
def read_doc(n: int) -> str:
    """One document, whole, by its number."""
    return long_script.doc(n, _scenario.doc_chars)


class LongReaderModel(Model):
    """The next document after the last read call in its input, then the answer."""

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
        reads = [
            json.loads(str(_field(i, "arguments")))["n"]
            for i in items
            if _field(i, "type") == "function_call" and _field(i, "name") == READ
        ]
        n = _scenario.next_doc(reads[-1] if reads else None)
        output: list[TResponseOutputItem]
        if n is None:
            results = [
                str(_field(i, "output"))
                for i in items
                if _field(i, "type") == "function_call_output"
            ]
            output = [_message(long_script.answer(results[-1] if results else ""))]
        else:
            call = ToolCall(id=f"r{n}", name=READ, arguments={"n": n})
            output = [_call(call, call.id)]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the long turn does not stream")


class LongReaderModels(ModelProvider):
    def get_model(self, model_name: str | None) -> Model:
        return LongReaderModel()


@workflow.defn(name="LongOpenAIAgentsTurn")
class LongOpenAIAgentsTurn:
    @workflow.run
    async def run(self, turn: LongPeerInput) -> PeerTurnOutput:
        agent: Agent[None] = Agent(
            name="Long reader",
            instructions="Read the documents one by one, then say how the last one ends.",
            model="long-reader",
            tools=[activity_as_tool(read_doc, start_to_close_timeout=TOOL_TIMEOUT)],
        )
        # Its default cap is 10 model calls: the long turn needs one per document.
        result = await Runner.run(agent, turn.question, max_turns=turn.steps + 5)
        return PeerTurnOutput(answer=str(result.final_output))


async def build_worker(address: str, task_queue: str, scenario: Scenario) -> Worker:
    global _scenario
    _scenario = scenario
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    plugin = OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(start_to_close_timeout=MODEL_TIMEOUT),
        model_provider=LongReaderModels(),
    )
    client = await Client.connect(address, plugins=[plugin])
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[LongOpenAIAgentsTurn],
        activities=[read_doc],
        activity_executor=ThreadPoolExecutor(max_workers=10),
    )
