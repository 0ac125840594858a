"""The plain-Python core, no server: offline model, tool registry, rendering, shop data."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from agent.conversation import AssistantMessage, ToolResult, UserMessage
from agent.errors import InvalidCall, NotFound, UnknownModel, permanent_error_types
from agent.model import ModelCatalog, ModelRequest, Reply
from agent.offline import DECLINE, OfflineModel
from agent.render import render_result
from agent.tools import ToolContext, ToolRegistry, tool
from agent.types import ToolCall, TurnInput
from shop import TOOLS, ShopStore
from shop.store import ORDER_NOT_FOUND
from tests.conftest import SEED_CASES, request


async def plan(question: str) -> Reply:
    return await OfflineModel().plan(request(question))


@pytest.mark.parametrize(
    ("question", "calls"),
    [
        ("Which item was ordered for 123456?", ["order_status(order_id='123456')"]),
        ("When is my return rtn003 processed?", ["return_status(return_id='rtn003')"]),
        ("Which item was ordered for 383833?", ["order_status(order_id='383833')"]),
        ("Could you tell me if order 123456 has shipped?", ["order_status(order_id='123456')"]),
        (
            "Has order 123456 shipped and is return rtn001 processed?",
            ["order_status(order_id='123456')", "return_status(return_id='rtn001')"],
        ),
        (
            "How many days do I have to return an item?",
            ["search_policies(query='How many days do I have to return an item?')"],
        ),
    ],
)
async def test_offline_model_picks_tools_and_fills_arguments(question: str, calls: list[str]):
    assert [c.render() for c in (await plan(question)).calls] == calls


@pytest.mark.parametrize(
    "question",
    [
        "How is the weather in Scotland right now?",
        "What is the impact of return rtn001 on world peace?",
        "hi",
        "Write me a poem about order 123456 and the ocean and the moon",
    ],
)
async def test_offline_model_declines_off_topic_questions(question: str) -> None:
    p = await plan(question)
    assert p.calls == [] and p.text == DECLINE


async def test_offline_model_asks_for_a_missing_id() -> None:
    p = await plan("Has my order shipped?")
    assert p.calls == []
    assert "order ID (6 digits" in p.text


async def test_offline_model_answers_from_the_results() -> None:
    call = ToolCall(id="c1", name="order_status", arguments={"order_id": "383833"})
    messages = [
        UserMessage(text="Which item was ordered for 383833?"),
        AssistantMessage(calls=[call]),
        ToolResult(call_id="c1", tool="order_status", ok=False, text=ORDER_NOT_FOUND),
    ]
    reply = await OfflineModel().interpret(ModelRequest(messages=messages))
    assert reply.calls == [] and reply.text == ORDER_NOT_FOUND
    assert reply.usage.model_calls == 1


def test_registry_explains_invalid_calls() -> None:
    with pytest.raises(InvalidCall, match="unknown tool 'nope'; available tools: order_status"):
        TOOLS.validate(ToolCall(id="1", name="nope"))
    with pytest.raises(InvalidCall, match=r"order_id: String should match pattern .* \(got '12'\)"):
        TOOLS.validate(ToolCall(id="1", name="order_status", arguments={"order_id": "12"}))
    with pytest.raises(InvalidCall, match="order_id: Field required"):
        TOOLS.validate(ToolCall(id="1", name="order_status", arguments={}))


def test_registry_knows_which_tools_write() -> None:
    assert TOOLS.side_effecting == ["start_return"]


def test_return_ids_are_normalised() -> None:
    call = ToolCall(id="1", name="return_status", arguments={"return_id": " RTN001 "})
    assert TOOLS.validate(call).model_dump() == {"return_id": "rtn001"}


def test_tool_decorator_reads_signature_and_docstring() -> None:
    class Args(BaseModel):
        n: int

    @tool(examples=["double 2"], timeout=timedelta(seconds=1))
    def double(args: Args, ctx: ToolContext[None]) -> int:
        """Doubles a number."""
        return args.n * 2

    assert double.spec.description == "Doubles a number."
    assert double.spec.parameters["required"] == ["n"]
    assert double(Args(n=2), ToolContext("c", None)) == 4
    with pytest.raises(ValueError, match="registered twice"):
        ToolRegistry([double, double])
    with pytest.raises(TypeError, match="pydantic model"):
        tool(lambda x, ctx: x)


def test_render_is_compact_and_capped() -> None:
    assert render_result({"item": "Soap", "shipped_on": None}) == "Item: Soap."
    assert render_result([]) == "(nothing found)"
    long = render_result("x" * 5000, limit=100)
    assert long.startswith("x" * 100) and long.endswith("[truncated 4900 more characters]")


def test_store_scopes_lookups_to_the_customer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = ShopStore(tmp_path / "shop.db")
    assert store.order("demo", "123456").item == "Herbal Handsoap"
    with pytest.raises(NotFound, match="Order not found"):
        store.order("cust-002", "123456")
    assert store.return_("demo", "rtn003").status == "received"
    assert store.search_policies("refund card")[0].title == "Refunds"
    ShopStore(tmp_path / "shop.db")  # opening again does not seed twice
    assert len(store.search_policies("policy returns refunds shipping warranty payment", 10)) == 5


def test_unknown_model_says_what_to_use() -> None:
    catalog = ModelCatalog({"offline": lambda _: OfflineModel()})
    assert catalog.resolve("offline") is catalog.resolve("offline")
    assert catalog.resolve("") is catalog.resolve("offline")  # the worker's default
    with pytest.raises(UnknownModel, match="unknown model 'gpt:x': use one of offline"):
        catalog.resolve("gpt:x")


def test_permanent_errors_exclude_transient_ones() -> None:
    names = permanent_error_types()
    assert {"NotFound", "InvalidModelOutput", "UnknownModel", "InvalidCall"} <= set(names)
    assert "ModelUnavailable" not in names and "ToolUnavailable" not in names


@pytest.mark.parametrize("question", ["", "   \n"])
def test_blank_questions_are_refused(question: str) -> None:
    with pytest.raises(ValidationError, match="the question is empty"):
        TurnInput(question=question)


def test_odd_customer_ids_are_refused() -> None:
    with pytest.raises(ValidationError, match="customer id must be"):
        TurnInput(question="q", customer_id="a b/../c")


def test_seed_cases_cover_the_six_questions() -> None:
    assert len(SEED_CASES) == 6
