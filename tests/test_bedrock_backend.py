"""The Bedrock Converse backend through a real turn workflow, with botocore's
Stubber standing in for the service: request shapes, tool-use round trip,
throttling retried, validation errors not retried."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.stub import ANY, Stubber

from agent.answers import DECLINE
from agent.backends.bedrock import BedrockConverseModel
from agent.types import Outcome, StepKind
from tests.conftest import SEED_CASES, Capture, Harness, kinds, stubbed_aws_client

MODEL_ID = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def bedrock() -> Iterator[tuple[BedrockConverseModel, Stubber]]:
    client = stubbed_aws_client("bedrock-runtime")
    with Stubber(client) as stubber:
        yield BedrockConverseModel(MODEL_ID, client=client), stubber
        stubber.assert_no_pending_responses()


def reply(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": {"inputTokens": 40, "outputTokens": 8, "totalTokens": 48},
        "metrics": {"latencyMs": 100},
    }


TOOL_USE = {
    "toolUse": {"toolUseId": "tu_1", "name": "order_status", "input": {"order_id": "123456"}}
}


def expected(messages: Any) -> dict[str, Any]:
    return {"modelId": MODEL_ID, "system": ANY, "messages": messages, "toolConfig": ANY}


async def test_tool_use_round_trip(harness: Harness, bedrock: Any) -> None:
    model, stubber = bedrock
    question = [{"role": "user", "content": [{"text": "Has order 123456 shipped?"}]}]
    stubber.add_response("converse", reply([TOOL_USE], "tool_use"), expected(question))
    stubber.add_response(
        "converse",
        reply([{"text": "Yes, it shipped on 2026-11-18."}], "end_turn"),
        expected(
            [
                *question,
                {"role": "assistant", "content": [TOOL_USE]},
                {
                    "role": "user",
                    "content": [
                        {
                            "toolResult": {
                                "toolUseId": "tu_1",
                                "content": [{"text": ANY}],
                                "status": "success",
                            }
                        }
                    ],
                },
            ]
        ),
    )
    result = await harness.ask("Has order 123456 shipped?", model=model)

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "Yes, it shipped on 2026-11-18."
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert result.usage.input_tokens == 80 and result.usage.output_tokens == 16


async def test_tool_specs_come_from_the_registry(bedrock: Any) -> None:
    from agent.model import ModelRequest
    from shop import TOOLS

    model, stubber = bedrock
    stubber.add_response(
        "converse",
        reply([{"text": "Sorry, I cannot answer that question."}], "end_turn"),
        {
            "modelId": MODEL_ID,
            "system": ANY,
            "messages": ANY,
            "toolConfig": {
                "tools": [
                    {
                        "toolSpec": {
                            "name": t.name,
                            "description": t.description,
                            "inputSchema": {"json": t.parameters},
                        }
                    }
                    for t in TOOLS.specs
                ]
            },
        },
    )
    plan = await model.plan(ModelRequest(question="hi", tools=TOOLS.specs))
    assert plan.calls == [] and plan.text == "Sorry, I cannot answer that question."


async def test_throttling_is_retried(harness: Harness, bedrock: Any) -> None:
    model, stubber = bedrock
    stubber.add_client_error("converse", "ThrottlingException", "slow down", 429)
    stubber.add_response("converse", reply([{"text": "Hello!"}], "end_turn"))
    result = await harness.ask("hi", model=model)
    assert result.outcome is Outcome.ANSWERED and result.answer == "Hello!"


async def test_validation_error_is_not_retried(harness: Harness, bedrock: Any) -> None:
    model, stubber = bedrock
    stubber.add_client_error("converse", "ValidationException", "bad toolConfig", 400)
    result = await harness.ask("hi", model=model)  # one stubbed response: a retry would fail
    assert result.outcome is Outcome.MODEL_ERROR
    failure = next(s for s in result.steps if s.kind is StepKind.LIMIT)
    assert "ValidationException" in failure.text and "bad toolConfig" in failure.text


async def test_guardrail_answer_runs_no_tools(harness: Harness, bedrock: Any) -> None:
    model, stubber = bedrock
    stubber.add_response(
        "converse", reply([{"text": "I can't help with that."}, TOOL_USE], "guardrail_intervened")
    )
    result = await harness.ask("Has order 123456 shipped?", model=model)
    assert result.answer == "I can't help with that."
    assert kinds(result) == ["answer"]


SEED_CALLS = {  # what a tool-using model asks for on each seed question
    SEED_CASES[0][0]: ("order_status", {"order_id": "123456"}),
    SEED_CASES[1][0]: ("return_status", {"return_id": "rtn003"}),
    SEED_CASES[3][0]: ("order_status", {"order_id": "383833"}),
    SEED_CASES[4][0]: ("return_status", {"return_id": "rtn123"}),
}


@pytest.mark.parametrize(("question", "wanted"), SEED_CASES)
async def test_seed_cases(harness: Harness, bedrock: Any, question: str, wanted: str) -> None:
    model, stubber = bedrock
    if question in SEED_CALLS:
        name, args = SEED_CALLS[question]
        use = {"toolUse": {"toolUseId": "tu_1", "name": name, "input": args}}
        seen = Capture()
        stubber.add_response("converse", reply([use], "tool_use"))
        stubber.add_response(
            "converse", reply([{"text": "The answer."}], "end_turn"), expected(seen)
        )
    else:
        stubber.add_response("converse", reply([{"text": DECLINE}], "end_turn"))
    result = await harness.ask(question, model=model)

    assert result.outcome is Outcome.ANSWERED
    if question in SEED_CALLS:
        tool_result = seen.seen[-1][-1]["content"][0]["toolResult"]  # messages[-1]
        assert wanted in tool_result["content"][0]["text"]
        assert result.answer == "The answer."
    else:
        assert result.answer == DECLINE
