"""The SageMaker text-completion backend through real turn workflows, with
botocore's Stubber as the endpoint: the seed's six cases with scripted
completions, the tolerant parser, payload formats and error mapping."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from durable_agent.answers import DECLINE
from durable_agent.backends.sagemaker import SageMakerTextModel, generated_text, parse_tools
from durable_agent.shop import TOOLS
from durable_agent.types import Outcome
from tests.conftest import SEED_CASES, Capture, Harness, kinds, request, stubbed_aws_client


@pytest.fixture
def endpoint() -> Iterator[tuple[Any, Stubber]]:
    client = stubbed_aws_client("sagemaker-runtime")
    with Stubber(client) as stubber:
        yield client, stubber


def completion(text: str) -> dict[str, Any]:
    data = json.dumps([{"generated_text": text}]).encode()
    return {"Body": StreamingBody(io.BytesIO(data), len(data)), "ContentType": "application/json"}


def expect(body: Capture) -> dict[str, Any]:
    return {
        "EndpointName": "flan-ul2",
        "ContentType": "application/json",
        "Accept": "application/json",
        "Body": body,
    }


PLANS = {  # what a Flan-style model completes for each seed question
    SEED_CASES[0][0]: "order_status",
    SEED_CASES[1][0]: "return_status",
    SEED_CASES[2][0]: "no_tool",
    SEED_CASES[3][0]: 'order_status(order_id="383833")',
    SEED_CASES[4][0]: "return_status(rtn123)",
    SEED_CASES[5][0]: "no_tool",
}


@pytest.mark.parametrize(("question", "expected"), SEED_CASES)
async def test_seed_cases(harness: Harness, endpoint: Any, question: str, expected: str) -> None:
    client, stubber = endpoint
    plan_body, interpret_body = Capture(), Capture()
    stubber.add_response("invoke_endpoint", completion(PLANS[question]), expect(plan_body))
    declines = expected == DECLINE
    if not declines:
        stubber.add_response("invoke_endpoint", completion(" The answer."), expect(interpret_body))
    model = SageMakerTextModel("flan-ul2", client=client)

    result = await harness.ask(question, model=model)

    assert result.outcome is Outcome.ANSWERED
    plan_prompt = json.loads(plan_body.seen[0])["inputs"]
    assert plan_prompt.endswith(f"user input: {question}\ntool:")
    assert "order_status: Status of a specific order" in plan_prompt
    if declines:
        assert result.answer == DECLINE and kinds(result) == ["answer"]
    else:
        interpret_prompt = json.loads(interpret_body.seen[0])["inputs"]
        assert expected in interpret_prompt  # the tool's result reached the model
        assert result.answer == "The answer."
    stubber.assert_no_pending_responses()


def test_parser_is_tolerant() -> None:
    specs = TOOLS.specs
    q = "Has order 123456 shipped and is return rtn001 processed?"
    calls = parse_tools("Tool: order_status, return_status.", specs, q)
    assert [c.render() for c in calls] == [
        "order_status(order_id='123456')",
        "return_status(return_id='rtn001')",
    ]
    (call,) = parse_tools("order_status(order_id='654321')", specs, q)
    assert call.arguments == {"order_id": "654321"}  # written arguments win
    assert parse_tools("no_tool", specs, q) == []
    assert parse_tools("I think the weather tool", specs, q) == []


def test_response_shapes() -> None:
    assert generated_text(b'[{"generated_text": "a"}]') == "a"
    assert generated_text(b'{"generated_texts": ["b"]}') == "b"
    assert generated_text(b"plain") == "plain"


async def test_text2text_payload(endpoint: Any) -> None:

    client, stubber = endpoint
    body = Capture()
    data = json.dumps({"generated_texts": ["no_tool"]}).encode()
    stubber.add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(data), len(data))},
        expect(body),
    )
    model = SageMakerTextModel("flan-ul2", client=client, payload="text2text")
    plan = await model.plan(request("hi"))
    assert plan.text == DECLINE
    sent = json.loads(body.seen[0])
    assert set(sent) == {"text_inputs", "max_length"}


async def test_throttled_endpoint_is_retried(harness: Harness, endpoint: Any) -> None:
    client, stubber = endpoint
    stubber.add_client_error("invoke_endpoint", "ThrottlingException", "slow down", 400)
    stubber.add_response("invoke_endpoint", completion("no_tool"))
    result = await harness.ask("hi", model=SageMakerTextModel("flan-ul2", client=client))
    assert result.outcome is Outcome.ANSWERED and result.answer == DECLINE


async def test_unknown_endpoint_is_not_retried(
    harness: Harness, endpoint: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client, stubber = endpoint
    stubber.add_client_error(
        "invoke_endpoint", "ValidationError", "Endpoint flan-ul2 of account 1 not found.", 400
    )
    result = await harness.ask("hi", model=SageMakerTextModel("flan-ul2", client=client))
    assert result.outcome is Outcome.MODEL_ERROR
    assert "model request rejected: scripted failed (request rejected)" in [
        s.text for s in result.steps
    ]
    # The account and endpoint SageMaker named are the operator's: the worker's log.
    assert "Endpoint flan-ul2 of account 1 not found" in caplog.text


async def test_interpret_may_name_the_next_tool(harness: Harness, endpoint: Any) -> None:
    client, stubber = endpoint
    first, second = Capture(), Capture()
    question = "Is the return for order 123456 (rtn001) processed?"
    stubber.add_response("invoke_endpoint", completion("order_status"))
    stubber.add_response("invoke_endpoint", completion("return_status"), expect(first))
    stubber.add_response("invoke_endpoint", completion("Yes, refunded."), expect(second))
    result = await harness.ask(question, model=SageMakerTextModel("flan-ul2", client=client))

    assert result.outcome is Outcome.ANSWERED and result.answer == "Yes, refunded."
    assert result.usage.model_calls == 3  # plan + two interprets; plan is not asked again
    assert kinds(result).count("continue") == 1
    prompt = json.loads(second.seen[0])["inputs"]
    # Both rounds' results, each after its call.
    assert "- order_status(order_id='123456'): " in prompt
    assert "- return_status(return_id='rtn001'): " in prompt
    stubber.assert_no_pending_responses()


async def test_interpret_never_repeats_a_call(harness: Harness, endpoint: Any) -> None:
    client, stubber = endpoint
    stubber.add_response("invoke_endpoint", completion("order_status"))
    stubber.add_response("invoke_endpoint", completion("order_status(order_id=123456)"))
    result = await harness.ask(
        "Has order 123456 shipped?", model=SageMakerTextModel("flan-ul2", client=client)
    )
    # Naming the call it already made is not a new call: the completion is the answer.
    assert result.usage.model_calls == 2
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
