"""The Bedrock Converse backend through real turn workflows, against a fake
`converse` as strict as the service (`tests/fakes/converse.py`: botocore's
parameter validation plus Converse's conversation rules): every way a turn can
go with its exact number of model calls, prompt caching, and error mapping."""

from __future__ import annotations

from typing import Any

import pytest

from durable_agent.answers import DECLINE
from durable_agent.backends.bedrock import CACHE_POINT, GUARDRAIL_ANSWER, BedrockConverseModel
from durable_agent.shop import TOOLS
from durable_agent.types import Outcome, StepKind, TurnLimits
from tests.conftest import SEED_CASES, Harness, kinds, request
from tests.fakes.converse import ConverseFake, refuse, said, tool_use, violation

MODEL_ID = "anthropic.claude-3-5-haiku-20241022-v1:0"
ORDER = ("order_status", {"order_id": "123456"})
RETURN = ("return_status", {"return_id": "rtn001"})


def model(fake: ConverseFake, **options: Any) -> BedrockConverseModel:
    return BedrockConverseModel(MODEL_ID, client=fake, **options)


def roles(params: dict[str, Any]) -> list[str]:
    return [m["role"] for m in params["messages"]]


def blocks(message: dict[str, Any]) -> list[str]:
    return [next(iter(b)) for b in message["content"]]


async def test_one_tool(harness: Harness) -> None:
    fake = ConverseFake([tool_use(ORDER), said("Yes, it shipped on 2026-11-18.")])
    result = await harness.ask("Has order 123456 shipped?", model=model(fake))

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "Yes, it shipped on 2026-11-18."
    assert kinds(result) == ["plan", "tool_call", "observation", "answer"]
    assert result.usage.model_calls == len(fake.accepted) == 2
    plan, interpret = fake.accepted
    assert plan["system"] == interpret["system"]  # one system prompt, unchanged
    assert roles(interpret) == ["user", "assistant", "user"]
    assert blocks(interpret["messages"][1]) == ["toolUse"]  # no blank text block
    tool_result = interpret["messages"][2]["content"][0]["toolResult"]
    assert (
        tool_result["toolUseId"] == interpret["messages"][1]["content"][0]["toolUse"]["toolUseId"]
    )
    assert tool_result["status"] == "success"
    assert "Herbal Handsoap" in tool_result["content"][0]["text"]


async def test_two_tools_in_sequence(harness: Harness) -> None:
    fake = ConverseFake([tool_use(ORDER), tool_use(RETURN, text="Now the return."), said("Done.")])
    result = await harness.ask("Has order 123456 shipped? Then rtn001?", model=model(fake))

    assert result.outcome is Outcome.ANSWERED and result.answer == "Done."
    assert result.usage.model_calls == len(fake.accepted) == 3
    last = fake.accepted[-1]
    assert roles(last) == ["user", "assistant", "user", "assistant", "user"]
    assert blocks(last["messages"][3]) == ["text", "toolUse"]  # the model's words, as sent
    assert last["messages"][3]["content"][0]["text"] == "Now the return."


async def test_two_tools_at_once(harness: Harness) -> None:
    fake = ConverseFake([tool_use(ORDER, RETURN), said("Both fine.")])
    result = await harness.ask("Order 123456 and return rtn001?", model=model(fake))

    assert result.outcome is Outcome.ANSWERED and result.answer == "Both fine."
    assert result.usage.model_calls == len(fake.accepted) == 2
    last = fake.accepted[-1]
    assert roles(last) == ["user", "assistant", "user"]
    assert blocks(last["messages"][2]) == ["toolResult", "toolResult"]  # one user message


async def test_bad_arguments_then_a_corrected_call(harness: Harness) -> None:
    fake = ConverseFake(
        [tool_use(("order_status", {"order_id": "12ab"})), tool_use(ORDER), said("Shipped.")]
    )
    result = await harness.ask("Has order 123456 shipped?", model=model(fake))

    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert result.usage.model_calls == len(fake.accepted) == 3
    assert kinds(result)[:3] == ["plan", "rejected", "plan"]
    error = fake.accepted[1]["messages"][2]["content"][0]["toolResult"]
    assert error["status"] == "error"
    assert "should match pattern" in error["content"][0]["text"]


async def test_unknown_tool_name(harness: Harness) -> None:
    fake = ConverseFake([tool_use(("track_parcel", {"id": "1"})), tool_use(ORDER), said("Ok.")])
    result = await harness.ask("Has order 123456 shipped?", model=model(fake))

    assert result.outcome is Outcome.ANSWERED and result.answer == "Ok."
    assert result.usage.model_calls == len(fake.accepted) == 3
    error = fake.accepted[1]["messages"][2]["content"][0]["toolResult"]
    assert error["content"][0]["text"].startswith("unknown tool 'track_parcel'")


async def test_throttling_first(harness: Harness) -> None:
    throttled = refuse("Too many requests", "ThrottlingException", 429)
    fake = ConverseFake([throttled, tool_use(ORDER), said("Shipped.")])
    result = await harness.ask("Has order 123456 shipped?", model=model(fake))

    assert result.outcome is Outcome.ANSWERED and result.answer == "Shipped."
    assert result.usage.model_calls == len(fake.accepted) == 2
    assert len(fake.requests) == 3


async def test_answer_without_a_tool(harness: Harness) -> None:
    fake = ConverseFake([said(DECLINE)])
    result = await harness.ask("How is the weather in Scotland right now?", model=model(fake))
    assert result.outcome is Outcome.ANSWERED and result.answer == DECLINE
    assert result.usage.model_calls == len(fake.accepted) == 1


async def test_tools_forever_hit_the_step_cap(harness: Harness) -> None:
    fake = ConverseFake([tool_use(ORDER) for _ in range(10)])
    result = await harness.ask(
        "Has order 123456 shipped?", model=model(fake), limits=TurnLimits(max_steps=2)
    )
    assert result.outcome is Outcome.STEP_LIMIT
    assert "Herbal Handsoap" in result.answer
    assert result.usage.model_calls == len(fake.accepted) == 3


async def test_cache_points_and_cached_tokens(harness: Harness) -> None:
    fake = ConverseFake([tool_use(ORDER), said("Shipped.")])
    result = await harness.ask("Has order 123456 shipped?", model=model(fake, cache_point=True))

    plan, interpret = fake.accepted
    assert plan["system"][-1] == CACHE_POINT
    assert plan["toolConfig"]["tools"][-1] == CACHE_POINT
    # Written on the first call, read on the second: the prefix never changes.
    assert result.usage.cached_input_tokens > 0
    assert result.usage.input_tokens > result.usage.cached_input_tokens


async def test_validation_error_is_not_retried(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    fake = ConverseFake([refuse("The provided model identifier is invalid.")])
    result = await harness.ask("hi", model=model(fake))
    assert result.outcome is Outcome.MODEL_ERROR
    assert len(fake.requests) == 1
    assert "refused the request" in result.answer
    failure = next(s for s in result.steps if s.kind is StepKind.LIMIT)
    assert failure.text == "model request rejected: scripted failed (request rejected)"
    # What Bedrock said is the operator's: the worker's log has it.
    assert "(ValidationException): The provided model identifier is invalid." in caplog.text


async def test_guardrail_answer_runs_no_tools(harness: Harness) -> None:
    reply = tool_use(ORDER)
    reply["stopReason"] = "guardrail_intervened"
    fake = ConverseFake([reply])
    result = await harness.ask("Has order 123456 shipped?", model=model(fake))
    assert result.answer == GUARDRAIL_ANSWER
    assert kinds(result) == ["answer"]


async def test_tool_specs_come_from_the_registry() -> None:
    fake = ConverseFake([said(DECLINE)])
    await model(fake).plan(request("hi"))
    assert fake.accepted[0]["toolConfig"] == {
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
    }


USE = {"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}
RESULT = {"toolResult": {"toolUseId": "t1", "content": [{"text": "x"}]}}
TOOLS_CONFIG = {"toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {}}}}]}}


@pytest.mark.parametrize(
    ("params", "refusal"),
    [
        ({"messages": [{"role": "assistant", "content": [{"text": "hi"}]}]}, "must start with a user"),  # noqa: E501
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "user", "content": [{"text": "b"}]}]},  # noqa: E501
            "must alternate",
        ),
        ({"messages": [{"role": "user", "content": [{"text": " "}]}]}, "is blank"),
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "assistant", "content": [USE]}, {"role": "user", "content": [{"text": "b"}]}], **TOOLS_CONFIG},  # noqa: E501
            "Expected toolResult blocks at messages.2.content for the following Ids: t1",
        ),
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "assistant", "content": [USE]}, {"role": "user", "content": [RESULT]}]},  # noqa: E501
            "toolConfig field must be defined",
        ),
        (
            {"messages": [{"role": "user", "content": [{"text": "a"}]}, {"role": "assistant", "content": [{"text": "b"}]}]},  # noqa: E501
            "must end with a user message",
        ),
        (
            {"messages": [{"role": "user", "content": [RESULT]}], **TOOLS_CONFIG},
            "unexpected tool_use_id found in tool_result blocks: t1",
        ),
    ],
)  # fmt: skip
def test_the_fake_refuses_what_bedrock_refuses(params: dict[str, Any], refusal: str) -> None:
    problem = violation({"modelId": MODEL_ID, **params})
    assert problem is not None and refusal in problem


SEED_CALLS = {  # what a tool-using model asks for on each seed question
    SEED_CASES[0][0]: ("order_status", {"order_id": "123456"}),
    SEED_CASES[1][0]: ("return_status", {"return_id": "rtn003"}),
    SEED_CASES[3][0]: ("order_status", {"order_id": "383833"}),
    SEED_CASES[4][0]: ("return_status", {"return_id": "rtn123"}),
}


@pytest.mark.parametrize(("question", "wanted"), SEED_CASES)
async def test_seed_cases(harness: Harness, question: str, wanted: str) -> None:
    if question in SEED_CALLS:
        fake = ConverseFake([tool_use(SEED_CALLS[question]), said("The answer.")])
    else:
        fake = ConverseFake([said(DECLINE)])
    result = await harness.ask(question, model=model(fake))

    assert result.outcome is Outcome.ANSWERED
    if question in SEED_CALLS:
        tool_result = fake.accepted[1]["messages"][-1]["content"][0]["toolResult"]
        assert wanted in tool_result["content"][0]["text"]
        assert result.answer == "The answer." and result.usage.model_calls == 2
    else:
        assert result.answer == DECLINE and result.usage.model_calls == 1


@pytest.mark.parametrize(("question", "expected"), SEED_CASES)
async def test_seed_cases_with_a_thinking_fake(
    harness: Harness, question: str, expected: str
) -> None:
    from tests.fakes.brain import offline_brain

    fake = ConverseFake(brain=offline_brain)
    result = await harness.ask(question, model=model(fake))
    assert result.outcome is Outcome.ANSWERED and expected in result.answer
    assert result.usage.model_calls == len(fake.requests) == (1 if expected == DECLINE else 2)
