"""The support agent's tools. Each is a plain function; `TOOLS` registers them."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StringConstraints

from durable_agent.errors import NotAllowed
from durable_agent.shop.store import (
    Order,
    PolicyHit,
    Return,
    ShopData,
    clean_reason,
    existing_return,
)
from durable_agent.subagents import agent_tool
from durable_agent.tools import ToolContext, ToolRegistry, tool


class OrderLookup(BaseModel):
    order_id: Annotated[
        str,
        StringConstraints(strip_whitespace=True, pattern=r"^\d{6}$"),
        Field(description="order ID (6 digits, like 123456)"),
    ]


class ReturnLookup(BaseModel):
    # The pattern stays in the JSON schema the model sees; RTN001 is accepted, stored lowercase.
    return_id: Annotated[
        str,
        StringConstraints(strip_whitespace=True, pattern=r"^(?i:rtn)\d{3,6}$"),
        AfterValidator(str.lower),
        Field(description="return ID (like rtn001)"),
    ]


class ReturnRequest(BaseModel):
    order_id: Annotated[
        str,
        StringConstraints(strip_whitespace=True, pattern=r"^\d{6}$"),
        Field(description="order ID (6 digits, like 123456)"),
    ]
    reason: str = Field(min_length=3, max_length=500, description="why the item goes back")


class Mine(BaseModel):
    """No arguments: the customer is the one the conversation is with."""


class PolicyQuery(BaseModel):
    query: str = Field(min_length=3, max_length=500, description="the question about policy")


@tool(
    examples=[
        "Has order 123456 shipped?",
        "Which item was ordered for 123456?",
        "What was the order total for order 234567?",
        "When will my order arrive?",
    ],
    timeout=timedelta(seconds=5),
    quick=True,
)
def order_status(args: OrderLookup, ctx: ToolContext[ShopData]) -> Order:
    """Status of a specific order: the item purchased, quantity, amount, and shipping
    status and delivery dates (and how many days late it is)."""
    return ctx.deps.order(ctx.customer_id, args.order_id)


@tool(
    examples=[
        "What orders do I have?",
        "Show me all my orders.",
        "List my recent purchases.",
        "Which orders did I place?",
    ],
    timeout=timedelta(seconds=5),
    quick=True,
)
def list_orders(args: Mine, ctx: ToolContext[ShopData]) -> list[Order]:
    """Your orders: every order of the customer, newest first, each with its status."""
    return ctx.deps.orders(ctx.customer_id)


TRACKING_PAGE = "https://shop.example/track/{order_id}"
"""The carrier's tracking page of a shipped order (the demo shop's own, made up)."""


@tool(
    examples=[
        "Can I get the tracking link for order 123456?",
        "Where can I track my parcel for order 234567?",
        "Send me the tracking number of 123456.",
    ],
    timeout=timedelta(seconds=5),
    quick=True,
    return_direct=True,
)
def tracking_link(args: OrderLookup, ctx: ToolContext[ShopData]) -> str:
    """The tracking link of a shipped order, for the customer to follow the parcel.
    Its result is the answer, word for word."""
    order = ctx.deps.order(ctx.customer_id, args.order_id)
    if order.shipped_on is None:
        raise NotAllowed(
            f"Order {order.order_id} has not shipped yet (status: {order.status}), so it has "
            "no tracking link; it is expected by "
            f"{order.expected_delivery or 'a date not set yet'}."
        )
    link = TRACKING_PAGE.format(order_id=order.order_id)
    return (
        f"You can follow order {order.order_id} ({order.quantity} × {order.item}, shipped "
        f"{order.shipped_on}) here: {link}"
    )


@tool(
    examples=[
        "Is my return rtn001 processed?",
        "What is happening to my return rtn002?",
        "Has my return been refunded yet?",
    ],
    timeout=timedelta(seconds=5),
    quick=True,
)
def return_status(args: ReturnLookup, ctx: ToolContext[ShopData]) -> Return:
    """Status of a specific return: whether it is pending, received, processed or
    refunded."""
    return ctx.deps.return_(ctx.customer_id, args.return_id)


def can_return(args: ReturnRequest, ctx: ToolContext[ShopData]) -> str:
    """Whether the return can be started (the order is the customer's, has shipped, and
    has no return yet), and what it will be: run before anyone is asked to consent."""
    order = ctx.deps.order(ctx.customer_id, args.order_id)
    returns = sorted(ctx.deps.returns_for(order.order_id), key=lambda r: r.return_id)
    latest = returns[-1] if returns else None
    if existing_return(order.order_id, order.status, latest) is not None:
        assert latest is not None
        raise NotAllowed(
            f"Order {order.order_id} already has an open return, {latest.return_id} "
            f"(status: {latest.status}; {latest.detail.rstrip('.')}), so no new one is "
            f"needed; ask about {latest.return_id} to follow it."
        )
    reason = clean_reason(order.order_id, args.reason)
    return (
        f"start a return of order {order.order_id} ({order.quantity} × {order.item}, "
        f"{order.total}) because: {reason}"
    )


@tool(
    examples=[
        "I want to return order 123456, it arrived damaged.",
        "Please start a return for order 234567: wrong size.",
        "Send back my order 345678, I don't need it anymore.",
    ],
    timeout=timedelta(seconds=5),
    side_effects=True,
    check=can_return,
)
def start_return(args: ReturnRequest, ctx: ToolContext[ShopData]) -> Return:
    """Start (create) a return for a shipped or delivered order, with the reason the
    customer wants to send the item back."""
    return ctx.deps.start_return(ctx.customer_id, args.order_id, args.reason, ctx.idempotency_key)


@tool(
    examples=[
        "How many days do I have to return an item?",
        "Do you ship internationally?",
        "How long does a refund take?",
        "Which payment methods do you accept?",
        "Do you accept gift cards?",
        "Is there a warranty on electric toothbrushes?",
        "My item arrived broken, what are my options?",
        "Can I return opened bath salts?",
        "Can I get a replacement for a faulty item?",
        "My parcel says delivered but I never got it.",
    ],
    timeout=timedelta(seconds=5),
    quick=True,
)
def search_policies(args: PolicyQuery, ctx: ToolContext[ShopData]) -> list[PolicyHit]:
    """Search the store's policy documents: returns, refunds, damaged, wrong or missing
    items, shipping costs and delivery times, warranty, payment methods and
    cancellations."""
    return ctx.deps.search_policies(args.query)


policy_expert = agent_tool(
    "policy_expert",
    "Ask the store's policy expert a question about returns, refunds, shipping costs and "
    "delivery times, warranty, payment methods or cancellations; it reads the policy "
    "documents and answers.",
    tools=["search_policies"],
    instructions=(
        "You are the store's policy expert. Look the question up with search_policies and "
        "answer in one or two sentences from the documents, quoting what they say."
    ),
    examples=search_policies.examples,
)


TOOLS = ToolRegistry(
    [order_status, list_orders, tracking_link, return_status, start_return, search_policies]
)
"""The support agent's tools: policy questions use the policy search directly."""

TOOLS_WITH_POLICY_EXPERT = ToolRegistry(
    [
        order_status,
        list_orders,
        tracking_link,
        return_status,
        start_return,
        replace(search_policies, top_level=False),
        policy_expert,
    ]
)
"""The same, but policy questions go to the `policy_expert` sub-agent, which alone may
use the policy search (a child turn of its own per question)."""
