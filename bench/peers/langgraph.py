"""LangGraph doing the benchmark's turns, through Temporal's plugin (temporalio-langgraph).

Set up as the plugin's documentation shows: a `StateGraph` registered by name with
`LangGraphPlugin` on the worker, each node marked `execute_in: activity` with its
timeout in the node's metadata, and the workflow compiling `graph(name)` and running
it. The graph is LangGraph's tool-calling loop: an agent node (one model call) and a
tools node (LangGraph's `ToolNode`: every call of a round), the agent routing to the
tools while it asks for calls. The model is a `ScriptedChatModel` (a LangChain chat
model); the turn's task reaches it through LangGraph's run context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypedDict, cast

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from langchain_core.callbacks import (
        AsyncCallbackManagerForLLMRun,
        CallbackManagerForLLMRun,
    )
    from langchain_core.language_models import BaseChatModel, LanguageModelInput
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
    )
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import Runnable
    from langchain_core.tools import BaseTool, tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition
    from langgraph.runtime import Runtime
    from temporalio.langgraph import LangGraphPlugin, graph

    from durable_agent.bench.peers import PeerTurnInput, PeerTurnOutput, script, shop

GRAPH = "shop_support"
"""The graph's name in the plugin; its nodes' activities are `shop_support.<node>`."""
INSTRUCTIONS = "Answer the customer's question about their order or return."
TOOL_TIMEOUT = timedelta(seconds=5)
"""As the agent's shop tools declare."""
MODEL_TIMEOUT = timedelta(seconds=60)
"""As the OpenAI Agents peer's model calls."""


class Context(TypedDict):
    """The run's context: which task of `bench.models.TASKS` the model plays."""

    task: str


@tool
def order_status(order_id: str) -> dict[str, Any]:
    """Status of a specific order: the item purchased, quantity, amount, and shipping
    status and delivery dates."""
    # A dict, so ToolNode hands the model JSON (a pydantic model would reach it as repr).
    return shop.order(order_id).model_dump(mode="json")


@tool
def return_status(return_id: str) -> dict[str, Any]:
    """Status of a specific return: whether it is pending, received, processed or
    refunded."""
    return shop.return_(return_id).model_dump(mode="json")


TOOLS = [order_status, return_status]


class ScriptedChatModel(BaseChatModel):
    """Asks for one task's rounds of calls, then answers with the results."""

    task: str = "one tool"

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        # The script names its calls itself: the tools' schemas are not needed.
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._reply(messages)  # no thread for a reply computed in place

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        results = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        calls = script.next_calls(self.task, len(results))
        if calls:
            message = AIMessage(
                content="",
                tool_calls=[
                    {"name": c.name, "args": c.arguments, "id": f"call-{len(results)}-{n}"}
                    for n, c in enumerate(calls)
                ],
            )
        else:
            message = AIMessage(content=script.answer(self.task, results))
        return ChatResult(generations=[ChatGeneration(message=message)])


tool_node = ToolNode(TOOLS)


async def agent(state: MessagesState, runtime: Runtime[Context]) -> dict[str, Any]:
    """One model call: the next round of tool calls, or the answer."""
    model = ScriptedChatModel(task=runtime.context["task"]).bind_tools(TOOLS)
    reply = await model.ainvoke([SystemMessage(INSTRUCTIONS), *_messages(state)])
    return {"messages": [reply]}


async def tools(state: MessagesState) -> dict[str, Any]:
    """Every call of the round, run by LangGraph's `ToolNode`."""
    return await tool_node.ainvoke({"messages": _messages(state)})


async def route(state: MessagesState) -> str:
    """To the tools while the model asks for calls, else to the end. Async: LangGraph
    runs a plain function in a thread pool, which a workflow does not have."""
    return tools_condition(cast(dict[str, Any], state))


def _messages(state: MessagesState) -> list[BaseMessage]:
    # A node's state reaches its activity through Temporal's data converter, which
    # knows no LangChain types: the messages arrive as plain dicts, and ToolNode only
    # finds calls on an AIMessage. LangGraph's reducer turns dicts back the same way.
    return convert_to_messages(state["messages"])


def build_graph() -> StateGraph[MessagesState, Context, MessagesState, MessagesState]:
    g = StateGraph(MessagesState, context_schema=Context)
    g.add_node(
        "agent",
        agent,
        metadata={"execute_in": "activity", "start_to_close_timeout": MODEL_TIMEOUT},
    )
    g.add_node(
        "tools",
        tools,
        metadata={"execute_in": "activity", "start_to_close_timeout": TOOL_TIMEOUT},
    )
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", END])
    g.add_edge("tools", "agent")
    return g


@workflow.defn(name="LangGraphTurn")
class LangGraphTurn:
    @workflow.run
    async def run(self, turn: PeerTurnInput) -> PeerTurnOutput:
        app = graph(GRAPH).compile()
        state = await app.ainvoke(
            {"messages": [HumanMessage(turn.question)]}, context=Context(task=turn.task)
        )
        return PeerTurnOutput(answer=str(state["messages"][-1].content))


async def build_worker(address: str, task_queue: str) -> Worker:
    client = await Client.connect(address)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[LangGraphTurn],
        plugins=[LangGraphPlugin(graphs={GRAPH: build_graph()})],
    )
