"""What calls cost: priced from genai-prices' bundled table (never downloaded), from
the operator's AGENT_MODEL_PRICES, free for the offline model, and "unknown", not
zero, for a model nobody prices; a turn carries the sum, or unknown."""

from __future__ import annotations

import socket

import pytest

from durable_agent.model import Reply
from durable_agent.pricing import (
    Price,
    PriceSettingError,
    Pricing,
    format_cost,
    parse_prices,
    usage_line,
)
from durable_agent.scripted import ScriptedModel
from durable_agent.types import ToolCall, Usage
from tests.conftest import Harness

# 1,000 input tokens of which 200 came from the prompt cache, and 100 output tokens.
USAGE = Usage(model_calls=1, input_tokens=1000, cached_input_tokens=200, output_tokens=100)
# OpenAI's gpt-4o: $2.50 input, $1.25 cached input, $10 output per million tokens.
GPT_4O = (800 * 2.50 + 200 * 1.25 + 100 * 10.0) / 1_000_000


@pytest.fixture(autouse=True)
def _official_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails the test: prices must come from the package itself."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pricing tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_a_known_model_is_priced_from_the_bundled_table(no_network: None) -> None:
    cost = Pricing().price(USAGE, "openai", "gpt-4o")
    assert cost == pytest.approx(GPT_4O)
    assert format_cost(cost) == "$0.00325"
    bedrock = Pricing().price(USAGE, "aws.bedrock", "anthropic.claude-3-5-haiku-20241022-v1:0")
    assert bedrock is not None and bedrock > 0


def test_an_unknown_model_costs_unknown_not_zero(no_network: None) -> None:
    pricing = Pricing()
    assert pricing.price(USAGE, "openai", "my-finetune-7b") is None
    # A provider the table is not asked about, even for a familiar model name.
    assert pricing.price(USAGE, "scripted", "gpt-4o") is None
    assert pricing.price(USAGE, "aws.sagemaker", "flan-ul2") is None
    assert format_cost(None) == "unknown"


def test_a_self_hosted_openai_compatible_server_is_not_priced_as_openai(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1")
    assert Pricing().price(USAGE, "openai", "gpt-4o") is None


def test_the_offline_model_is_free() -> None:
    assert Pricing().price(USAGE, "offline", "offline-keyword-v1") == 0.0
    assert format_cost(0.0) == "$0"


def test_the_operators_prices_come_first_by_spec_or_name() -> None:
    pricing = Pricing.from_env({"AGENT_MODEL_PRICES": "sagemaker:flan-ul2=1/2, gpt-4o=5/20/0.5"})
    # Cached input at the input rate when no cached rate is given.
    assert pricing.price(USAGE, "aws.sagemaker", "flan-ul2", "sagemaker:flan-ul2") == (
        pytest.approx((1000 * 1 + 100 * 2) / 1_000_000)
    )
    assert pricing.price(USAGE, "openai", "gpt-4o", "openai:gpt-4o") == pytest.approx(
        (800 * 5 + 200 * 0.5 + 100 * 20) / 1_000_000
    )
    bedrock_id = "bedrock:anthropic.claude-3-5-haiku-20241022-v1:0"
    assert parse_prices(f"{bedrock_id}=0.8/4") == {bedrock_id: Price(0.8, 4.0)}


# 1,000 input tokens: 600 read from the prompt cache, 300 written to it, 100 neither.
CACHING = Usage(
    model_calls=1,
    input_tokens=1000,
    cached_input_tokens=600,
    cache_write_tokens=300,
    output_tokens=100,
)


def test_cache_reads_and_writes_are_priced_at_their_own_rates(no_network: None) -> None:
    """Claude Sonnet 4.6: $3 input, $0.30 cache reads, $3.75 cache writes (5 minutes),
    $15 output per million tokens; the operator's fourth number is the write rate."""
    cost = Pricing().price(CACHING, "anthropic", "claude-sonnet-4-6")
    assert cost == pytest.approx((100 * 3 + 600 * 0.30 + 300 * 3.75 + 100 * 15) / 1_000_000)
    assert Pricing().price(CACHING, "anthropic", "claude-haiku-4-5-20251001") is not None
    assert Pricing().price(CACHING, "anthropic", "deepseek-chat") is None
    own = Pricing.from_env({"AGENT_MODEL_PRICES": "anthropic:claude-x=2/10/0.2/2.5"})
    assert own.price(CACHING, "anthropic", "claude-x", "anthropic:claude-x") == pytest.approx(
        (100 * 2 + 600 * 0.2 + 300 * 2.5 + 100 * 10) / 1_000_000
    )
    assert usage_line(CACHING).startswith(
        "usage: 1 model call(s), 1000 in / 100 out tokens (600 cached, 300 written to cache)"
    )


@pytest.mark.parametrize(
    "text", ["gpt-4o=5", "gpt-4o", "=1/2", "gpt-4o=1/x", "m=-1/2", "m=1/2/3/4/5"]
)
def test_a_malformed_price_setting_shows_the_shape(text: str) -> None:
    with pytest.raises(PriceSettingError, match=r"MODEL=INPUT/OUTPUT\[/CACHED_INPUT\[/CACHE_W"):
        parse_prices(text)


def test_a_turns_cost_is_unknown_when_any_call_is() -> None:
    priced = Usage(model_calls=1, cost_usd=0.25)
    assert (priced + priced).cost_usd == 0.5
    assert (priced + Usage(model_calls=1, cost_usd=None)).cost_usd is None
    assert "cost unknown" in usage_line(priced + Usage(cost_usd=None))
    assert usage_line(priced).endswith("cost $0.25")


async def test_a_turn_adds_up_what_its_calls_cost(harness: Harness) -> None:
    """Two calls of a priced model (plan, interpret), each priced by the worker."""
    model = ScriptedModel(
        plans=[
            Reply(
                calls=[ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})],
                usage=USAGE,
            )
        ],
        decisions=[Reply(text="It shipped.", usage=USAGE)],
        name="gpt-4o",
    )
    model.provider = "openai"  # type: ignore[misc] - a scripted stand-in for OpenAI's model
    result = await harness.ask("Has order 123456 shipped?", model=model)
    assert result.usage.model_calls == 2
    assert result.usage.cost_usd == pytest.approx(2 * GPT_4O)

    unpriced = ScriptedModel(plans=[Reply(text="Hello.", usage=USAGE)])
    assert (await harness.ask("hi", model=unpriced)).usage.cost_usd is None
