"""The demo shop's support agent, defined as anyone's agent is (`durable_agent.Agent`).

python worker.py                                  # serves it (the default agent)
python worker.py --agent durable_agent.shop.agent:support       # the same, named
AGENT_POLICY_EXPERT=1 python worker.py            # policy questions go to a sub-agent
"""

from __future__ import annotations

import os
from dataclasses import replace

from durable_agent import Agent, Refusals
from durable_agent.answers import DECLINE
from durable_agent.shop.phrasebook import offline_model
from durable_agent.shop.stores import open_store
from durable_agent.shop.tools import TOOLS, TOOLS_WITH_POLICY_EXPERT

HANDOFF = (
    "A person on our support team can do that: email support@shop.example with your "
    "order ID, and they answer within one business day."
)
"""Where a customer turns for what the agent cannot do (cancel an order, change an
address)."""

INSTRUCTIONS = (
    "You are a customer-support agent. Use the tools to look things up; never make up "
    "order or return data. Call several tools at once when they do not depend on each "
    "other. When the tool results answer the question, reply to the customer briefly "
    "from them, in English.\n"
    f"When the customer asks for something the tools cannot do, say: {HANDOFF}\n"
    f"If a question is not about what the tools cover, reply exactly: {DECLINE}"
)

EXAMPLES = (
    "Has order 123456 shipped?",
    "When is my return rtn003 processed?",
    "What is your return policy?",
    "I want to return order 123456, the soap is broken",
)

support = Agent(
    name="shop",
    title="Support",
    description="questions about your orders, returns and our store policies",
    instructions=INSTRUCTIONS,
    tools=TOOLS,
    examples=EXAMPLES,
    refusals=Refusals(
        decline=DECLINE,
        question=(
            "Sorry, I can't help with that request. I can answer questions about your "
            "orders, returns and our store policies."
        ),
        answer=(
            "Sorry, I can't share that answer: it held information I may not give out. "
            "Please ask about your own orders and returns."
        ),
    ),
    # The store is opened once per worker: SQLite (default) or DynamoDB (AGENT_SHOP_STORE).
    deps=open_store,
    # The offline model, with the shop's words for its records.
    models={"offline": offline_model},
)
"""The support agent: orders, tracking links, returns (a write: it needs consent) and
the policy documents."""

support_with_expert = replace(support, tools=TOOLS_WITH_POLICY_EXPERT)
"""The same, but policy questions go to the `policy_expert` sub-agent, which alone may
use the policy search (a child turn of its own per question)."""


def agent() -> Agent:
    """`AGENT_POLICY_EXPERT=1`: `support_with_expert`; else `support`."""
    if os.environ.get("AGENT_POLICY_EXPERT", "").strip() in ("1", "true"):
        return support_with_expert
    return support
