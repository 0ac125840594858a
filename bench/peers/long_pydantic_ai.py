"""Pydantic AI's durable agent doing the long turn.

Set up as `bench.peers.pydantic_ai` is (its documented way): an `Agent` with the
`TemporalDurability` capability at module level, a workflow listing it, and
`PydanticAIPlugin` on the client; each model request and each tool call an activity.
Its `FunctionModel` makes the long turn's decisions (`bench.long_script`) from the
messages it is given.
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
    from pydantic_ai.usage import UsageLimits

    from durable_agent.bench import long_script
    from durable_agent.bench.long_script import READ, Scenario
    from durable_agent.bench.peers import LongPeerInput, PeerTurnOutput

_scenario = Scenario(write_every=0)
"""The long turn in this worker (`build_worker`): the documents' number and size."""


def read_doc(n: int) -> str:
    """One document, whole, by its number."""
    return long_script.doc(n, _scenario.doc_chars)


def scripted() -> FunctionModel:
    """The next document after the last read call in the messages, then the answer."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        scenario = _scenario
        reads = [
            int(part.args_as_dict()["n"])
            for message in messages
            if isinstance(message, ModelResponse)
            for part in message.parts
            if isinstance(part, ToolCallPart) and part.tool_name == READ
        ]
        n = scenario.next_doc(reads[-1] if reads else None)
        if n is not None:
            return ModelResponse(parts=[ToolCallPart(READ, {"n": n}, tool_call_id=f"r{n}")])
        results = [
            part.model_response_str()
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart) and part.tool_name == READ
        ]
        return ModelResponse(parts=[TextPart(long_script.answer(results[-1] if results else ""))])

    return FunctionModel(reply, model_name="long-reader")


agent = Agent(
    scripted(),
    name="long_reader",
    instructions="Read the documents one by one, then say how the last one ends.",
    tools=[read_doc],
    capabilities=[TemporalDurability()],
)


@workflow.defn(name="LongPydanticAITurn")
class LongPydanticAITurn(PydanticAIWorkflow):
    __pydantic_ai_agents__ = [agent]

    @workflow.run
    async def run(self, turn: LongPeerInput) -> PeerTurnOutput:
        # Its default cap is 50 requests: the long turn needs one per document.
        limits = UsageLimits(request_limit=turn.steps + 5)
        result = await agent.run(turn.question, usage_limits=limits)
        return PeerTurnOutput(answer=result.output)


async def build_worker(address: str, task_queue: str, scenario: Scenario) -> Worker:
    global _scenario
    _scenario = scenario
    client = await Client.connect(address, plugins=[PydanticAIPlugin()])
    return Worker(client, task_queue=task_queue, workflows=[LongPydanticAITurn])
