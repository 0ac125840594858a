"""Lambda tools through real turn workflows, with botocore's Stubber as Lambda."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from durable_agent.lambda_tools import lambda_tool
from durable_agent.model import Reply
from durable_agent.scripted import ScriptedModel
from durable_agent.shop.tools import OrderLookup
from durable_agent.tools import ToolRegistry
from durable_agent.types import Outcome, ToolCall
from tests.conftest import Harness, last_result, story, stubbed_aws_client


@pytest.fixture
def stubbed() -> Iterator[tuple[ToolRegistry, Stubber]]:
    client = stubbed_aws_client("lambda")
    tool = lambda_tool(
        name="order_status",
        function="LLMAgentOrdersTool",
        args=OrderLookup,
        description="Status of a specific order.",
        payload=lambda a, ctx: {"orderId": a.order_id, "customerId": ctx.customer_id},
        client=client,
    )
    with Stubber(client) as stubber:
        yield ToolRegistry([tool]), stubber


def answer(payload: bytes, **extra: Any) -> dict[str, Any]:
    return {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(payload), len(payload)), **extra}


EXPECTED = {
    "FunctionName": "LLMAgentOrdersTool",
    "InvocationType": "RequestResponse",
    "Payload": json.dumps({"orderId": "123456", "customerId": "demo"}).encode(),
}


def model() -> ScriptedModel:
    call = ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})
    return ScriptedModel(
        plans=[Reply(calls=[call])],
        decisions=[lambda req: Reply(text=last_result(req))],
    )


async def ask(harness: Harness, tools: ToolRegistry) -> Any:
    return await harness.ask("Has order 123456 shipped?", model=model(), tools=tools)


async def test_invokes_the_function_with_the_seed_payload(harness: Harness, stubbed: Any) -> None:
    tools, stubber = stubbed
    body = json.dumps({"item": "Herbal Handsoap", "status": "shipped"})
    stubber.add_response(
        "invoke", answer(json.dumps({"statusCode": 200, "body": body}).encode()), EXPECTED
    )
    result = await ask(harness, tools)
    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "Item: Herbal Handsoap. Status: shipped."


async def test_function_error_is_an_observation(harness: Harness, stubbed: Any) -> None:
    tools, stubber = stubbed
    err = json.dumps({"errorMessage": "KeyError: 'orderId'", "errorType": "KeyError"}).encode()
    stubber.add_response("invoke", answer(err, FunctionError="Unhandled"), EXPECTED)
    result = await ask(harness, tools)
    observation = story(result)[-2].observation
    assert observation is not None and not observation.ok
    assert observation.text == "order_status failed: KeyError: 'orderId'"


async def test_bad_payload_is_an_observation(harness: Harness, stubbed: Any) -> None:
    tools, stubber = stubbed
    stubber.add_response("invoke", answer(b"<html>oops</html>"), EXPECTED)
    result = await ask(harness, tools)
    assert (
        story(result)[-2].text == "order_status: order_status returned a payload that is not JSON"
    )


async def test_not_found_status_is_an_observation(harness: Harness, stubbed: Any) -> None:
    tools, stubber = stubbed
    body = {"statusCode": 404, "body": "Order not found. Please check your Order ID."}
    stubber.add_response("invoke", answer(json.dumps(body).encode()), EXPECTED)
    result = await ask(harness, tools)
    assert result.answer == "Order not found. Please check your Order ID."


async def test_throttling_is_retried(harness: Harness, stubbed: Any) -> None:
    tools, stubber = stubbed
    stubber.add_client_error("invoke", "TooManyRequestsException", "Rate exceeded", 429)
    stubber.add_response("invoke", answer(b'{"status": "shipped"}'), EXPECTED)
    result = await ask(harness, tools)
    assert result.answer == "Status: shipped."
    stubber.assert_no_pending_responses()
