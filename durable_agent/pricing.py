"""What model calls cost, in US dollars: a price, or "unknown", never a made-up zero.

    Pricing.from_env().price(usage, provider, model, spec)   -> float | None

A call is priced by the first of these that knows its model:

1. `AGENT_MODEL_PRICES`, the operator's word: a self-hosted endpoint or a negotiated
   rate, in US dollars per million tokens, keyed by model spec or model name:
   `openai:llama3.1=0.10/0.20/0.05,sagemaker:flan-ul2=0.30/0.30` (input / output /
   cached input / cache writes; cached input and cache writes cost as much as input
   when left out).
2. The offline model runs inside the worker: it costs nothing.
3. `genai-prices` (PyPI, maintained by the Pydantic team): input, cached input, cache
   write and output prices by provider and model (Claude's models among them, whatever
   address serves them: no one else serves a model named `claude-…`). Its table ships
   inside the package; nothing here starts its `UpdatePrices`, so nothing is downloaded
   at run time.
4. Otherwise the cost is unknown (None), and so is the cost of any turn that made
   such a call: a sum that silently leaves out calls would be wrong, not cheap.

The activity prices each call right after the model answered, so the price of the
day is used and the workflow only adds numbers up (deterministically).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from durable_agent.types import Usage

SETTING = "AGENT_MODEL_PRICES"

FREE_PROVIDERS = frozenset({"offline"})
"""Providers whose calls cost nothing: the offline model is a program in the worker."""

# This project's provider names (`Model.provider`, the GenAI conventions' names) to
# the provider ids of genai-prices. Providers missing here are never looked up by
# model name alone: a self-hosted model called `gpt-4o` is not OpenAI's.
TABLE_PROVIDERS = {"openai": "openai", "aws.bedrock": "aws", "anthropic": "anthropic"}

log = logging.getLogger(__name__)


class PriceSettingError(ValueError):
    """`AGENT_MODEL_PRICES` cannot be read; the message shows the expected shape."""


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float
    cached_input: float | None = None
    """Cached (prompt-cache read) input tokens; None: the same as `input`."""
    cache_write: float | None = None
    """Input tokens written to the prompt cache; None: the same as `input`."""

    def of(self, usage: Usage) -> float:
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        write_rate = self.input if self.cache_write is None else self.cache_write
        dollars = (
            (usage.input_tokens - cached - written) * self.input
            + cached * cached_rate
            + written * write_rate
            + usage.output_tokens * self.output
        )
        return dollars / 1_000_000


def parse_prices(text: str) -> dict[str, Price]:
    """`MODEL=INPUT/OUTPUT[/CACHED_INPUT[/CACHE_WRITE]],...` → prices by model spec or
    name."""
    prices: dict[str, Price] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        # The last `=`: Bedrock ids contain colons, never an equals sign.
        key, _, rates = item.rpartition("=")
        try:
            numbers = [float(r) for r in rates.split("/")]
        except ValueError:
            numbers = []
        if not key.strip() or len(numbers) not in (2, 3, 4) or min(numbers) < 0:
            raise PriceSettingError(
                f"{SETTING}: {item!r} is not MODEL=INPUT/OUTPUT[/CACHED_INPUT[/CACHE_WRITE]] "
                "in US dollars per million tokens, e.g. openai:llama3.1=0.10/0.20/0.05"
            )
        prices[key.strip()] = Price(*numbers)
    return prices


class Pricing:
    """Prices model calls: the settings' prices, then the free providers, then the table."""

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self.prices = dict(prices or {})

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Pricing:
        return cls(parse_prices(env.get(SETTING, "")))

    def price(self, usage: Usage, provider: str, model: str, spec: str = "") -> float | None:
        """What one call (or several of one model) cost; None when nobody knows.

        `spec` is the turn's model spec (`openai:llama3.1`), `model` the model's own
        name (`llama3.1`): a setting may name either.
        """
        own = self.prices.get(spec) or self.prices.get(model)
        if own is not None:
            return own.of(usage)
        if provider in FREE_PROVIDERS:
            return 0.0
        return table_price(usage, provider, model)


def table_price(usage: Usage, provider: str, model: str) -> float | None:
    """The price from genai-prices' bundled table, or None if it does not know the
    model (or is not installed: it needs Python 3.11)."""
    provider_id = TABLE_PROVIDERS.get(provider)
    if provider_id is None:  # a provider the table has none of: not even loaded
        return None
    table = _table()
    if table is None:
        return None
    # An OpenAI-compatible server elsewhere (vLLM, Groq, a proxy) is priced as whoever
    # serves at that address, if the table knows it, and otherwise not at all.
    base_url = os.environ.get("OPENAI_BASE_URL", "") if provider == "openai" else ""
    where = {"provider_api_url": base_url} if base_url else {"provider_id": provider_id}
    counted = table.Usage(
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
    )
    try:
        return float(table.calc_price(counted, model, **where).total_price)
    except LookupError:
        return None
    except Exception:  # the call is made and paid for: never fail it over its price
        log.warning("cannot price %s %s with genai-prices", provider, model, exc_info=True)
        return None


@functools.cache
def _table() -> ModuleType | None:
    try:
        import genai_prices
    except ImportError:
        return None
    return genai_prices


def cost_of(usage: Usage) -> float | None:
    """The cost `usage` carries (`Usage.cost_usd`); None, unknown, when it carries none."""
    cost: float | None = usage.cost_usd
    return cost


def format_cost(cost: float | None) -> str:
    """`$0.00325`, `$0`, or `unknown`: how a cost reads in the CLI, logs and the Web UI."""
    if cost is None:
        return "unknown"
    return "$" + f"{cost:.6f}".rstrip("0").rstrip(".")


def usage_line(usage: Usage) -> str:
    """`usage: 2 model call(s), 93 in / 13 out tokens, cost $0`: a turn's usage in one
    line, the same in the CLI and the Web UI."""
    cache = [f"{usage.cached_input_tokens} cached"] if usage.cached_input_tokens else []
    if usage.cache_write_tokens:
        cache.append(f"{usage.cache_write_tokens} written to cache")
    cached = f" ({', '.join(cache)})" if cache else ""
    return (
        f"usage: {usage.model_calls} model call(s), {usage.input_tokens} in / "
        f"{usage.output_tokens} out tokens{cached}, cost {format_cost(cost_of(usage))}"
    )
