"""One trace per turn: the client's start, the workflow, all five activity kinds,
the model calls (`gen_ai.*`) and the tool calls; nothing duplicated on replay."""

from __future__ import annotations

from collections import Counter

import opentelemetry.trace
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import OpenTelemetryPlugin, create_tracer_provider
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from agent.types import TurnInput
from client import start_turn
from shop import ShopStore
from tests.conftest import Harness


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    opentelemetry.trace.set_tracer_provider(provider)
    return exporter


async def test_one_trace_per_turn(
    env: WorkflowEnvironment, store: ShopStore, exporter: InMemorySpanExporter
) -> None:
    client = await Client.connect(
        env.client.service_client.config.target_host,
        namespace=env.client.namespace,
        data_converter=pydantic_data_converter,
        plugins=[OpenTelemetryPlugin(add_temporal_spans=True)],
    )
    exporter.clear()
    # No workflow cache: every workflow task replays the history from the start,
    # so a span that is not replay-safe would show up more than once.
    async with Harness(client, store).worker(max_cached_workflows=0) as task_queue:
        handle = await start_turn(
            client, TurnInput(question="Has order 123456 shipped?"), task_queue
        )
        await handle.result()

    spans = exporter.get_finished_spans()
    names = Counter(s.name for s in spans)
    for name in [
        "StartWorkflow:AgentTurn",
        "RunWorkflow:AgentTurn",
        "RunActivity:plan",
        "RunActivity:parse",
        "RunActivity:dispatch",
        "RunActivity:parse_output",
        "RunActivity:interpret",
        "StartActivity:plan",
        "StartActivity:dispatch",
        "execute_tool order_status",
        "invoke_agent support-agent",
    ]:
        assert names[name] == 1, f"{name}: {names[name]} spans in {sorted(names)}"
    assert len({s.context.trace_id for s in spans}) == 1

    by_id = {s.context.span_id: s for s in spans}

    def ancestors(span):  # type: ignore[no-untyped-def]
        while span.parent is not None and span.parent.span_id in by_id:
            span = by_id[span.parent.span_id]
            yield span.name

    (agent,) = [s for s in spans if s.name == "invoke_agent support-agent"]
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["agent.outcome"] == "answered"
    assert agent.attributes["gen_ai.usage.input_tokens"] > 0
    assert "RunWorkflow:AgentTurn" in ancestors(agent)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == 2  # plan + interpret
    for chat in chats:
        assert chat.attributes["gen_ai.provider.name"] == "offline"
        assert chat.attributes["gen_ai.request.model"] == "offline-keyword-v1"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert "invoke_agent support-agent" in ancestors(chat)
    (tool,) = [s for s in spans if s.name == "execute_tool order_status"]
    dispatch = next(s for s in spans if s.name == "RunActivity:dispatch")
    assert tool.parent is not None and tool.parent.span_id == dispatch.context.span_id
