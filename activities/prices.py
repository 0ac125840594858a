"""prices (local activity): which of a turn's models have no known price.

A turn with a spending cap (`TurnLimits.max_cost`) asks before its first model call:
a cap is only kept when every call can be priced, so a model whose price nobody knows
(`durable_agent.pricing`: `AGENT_MODEL_PRICES`, the offline model, genai-prices' table)
refuses the turn, naming the model, rather than leaving it silently uncapped. Only a
read of the worker's settings: a turn without a cap never runs it.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from durable_agent.errors import ModelError
from durable_agent.pricing import Pricing
from durable_agent.serving import Agents
from durable_agent.types import Usage

PROBE = Usage(input_tokens=1_000, output_tokens=1_000)
"""Any usage will do: a price is known for all of it or for none."""


class PricesInput(BaseModel):
    models: list[str]
    """The turn's model specs, in order (empty spec: its agent's default)."""
    agent: str = ""
    """The turn's agent (empty: the worker's first), whose models resolve the specs."""


class PricesOutput(BaseModel):
    unpriced: list[str] = []
    """The specs of `models` whose calls cannot be priced, as the worker resolved them."""


class PricesActivity:
    def __init__(self, agents: Agents, pricing: Pricing | None = None) -> None:
        self._agents = agents
        # Read at worker start, as the model calls read it: both price alike.
        self._pricing = pricing if pricing is not None else Pricing.from_env()

    @activity.defn(name="prices")
    async def prices(self, input: PricesInput) -> PricesOutput:
        served = self._agents.get(input.agent)
        unpriced = []
        for given in input.models:
            spec = given or served.models.default
            try:
                model = await served.models.get(spec)
            except ModelError:
                continue  # a spec no backend serves: the model call says so (UnknownModel)
            if self._pricing.price(PROBE, model.provider, model.name, spec) is None:
                unpriced.append(spec)
        return PricesOutput(unpriced=unpriced)
