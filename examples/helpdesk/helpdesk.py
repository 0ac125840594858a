"""An IT help desk agent: ticket status, service status, new tickets and refunds of what
the desk charged (both with consent).

cd examples/helpdesk
python ../../worker.py --task-queue helpdesk --agent helpdesk:agent
python ../../client.py --task-queue helpdesk ask --agent helpdesk "Is the VPN down?"
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Annotated, Literal

from desk import Desk, Refund, Service, Ticket
from pydantic import BaseModel, Field, StringConstraints

from durable_agent import Agent, ApprovalPolicy, Refusals, ToolContext, tool


class TicketLookup(BaseModel):
    ticket_id: Annotated[
        str,
        StringConstraints(strip_whitespace=True, pattern=r"^(?i:INC)-\d{4}$"),
        Field(description="ticket ID (like INC-1001)"),
    ]


class ServiceLookup(BaseModel):
    service: str = Field(
        pattern=r"^(?i:email|vpn|wiki|payroll)$",
        description="the service: email, vpn, wiki or payroll",
    )


class NewTicket(BaseModel):
    title: str = Field(min_length=5, max_length=200, description="what is wrong, in one line")
    priority: Literal["low", "normal", "high"] = "normal"


class RefundRequest(BaseModel):
    charge_id: Annotated[
        str,
        StringConstraints(strip_whitespace=True, pattern=r"^(?i:CHG)-\d{4}$"),
        Field(description="charge ID (like CHG-5001)"),
    ]
    amount: str = Field(
        pattern=r"^\d{1,3}\.\d{2}$",
        description="how much to give back, in US dollars and cents (like 45.00)",
    )
    reason: str = Field(min_length=3, max_length=300, description="why it is refunded")


@tool(examples=["What is the status of ticket INC-1001?", "Any news on INC-1002?"], quick=True)
def ticket_status(args: TicketLookup, ctx: ToolContext[Desk]) -> Ticket:
    """Status of one of your tickets: its title, status, priority and last update."""
    return ctx.deps.ticket(ctx.customer_id, args.ticket_id)


@tool(examples=["Is the VPN down?", "Is email working?", "Is payroll up?"], quick=True)
def service_status(args: ServiceLookup, ctx: ToolContext[Desk]) -> Service:
    """Whether a service (email, vpn, wiki, payroll) is operational, degraded or down,
    and what is being done about it."""
    return ctx.deps.service(args.service)


@tool(
    examples=[
        "Please open a ticket: my laptop will not boot.",
        "Open a ticket, the badge reader is broken.",
    ],
    timeout=timedelta(seconds=5),
    side_effects=True,
)
def open_ticket(args: NewTicket, ctx: ToolContext[Desk]) -> Ticket:
    """Open a new ticket for something that is broken or needed."""
    return ctx.deps.open_ticket(ctx.customer_id, args.title, args.priority, ctx.idempotency_key)


@tool(
    examples=[
        "Please refund 45.00 of charge CHG-5001, the repair was never done.",
        "Refund 20.00 of CHG-5002: the headset arrived broken.",
    ],
    timeout=timedelta(seconds=5),
    side_effects=True,
)
def refund(args: RefundRequest, ctx: ToolContext[Desk]) -> Refund:
    """Refund part or all of something the desk charged you for (a repair, a device)."""
    who = ctx.principal  # the tenant and user from the application's login, never the model
    cents = int(args.amount.replace(".", ""))
    return ctx.deps.refund(
        who.tenant, who.user, args.charge_id, cents, args.reason, ctx.idempotency_key
    )


agent = Agent(
    name="helpdesk",
    title="IT help desk",
    description="your tickets, the status of IT services, new tickets and refunds",
    instructions=(
        "You are the IT help desk. Look tickets and services up with the tools; never "
        "guess a status. Open a ticket or refund a charge only when the person asks for "
        "it. Answer in one or two sentences. If a question is not about IT tickets or "
        "services, reply exactly: Sorry, the help desk can only help with IT tickets and "
        "services."
    ),
    tools=[ticket_status, service_status, open_ticket, refund],
    examples=["Is the VPN down?", "What is the status of ticket INC-1001?"],
    refusals=Refusals(decline="Sorry, the help desk can only help with IT tickets and services."),
    deps=Desk.open,
)

# The same desk in a service with many customers (`--agent helpdesk:with_leads`): a
# refund waits for a support lead of the asker's tenant, never for the asker; a new
# ticket for either (docs/identity-and-consent.md). Same name: the service asks
# `helpdesk` either way.
with_leads = replace(
    agent,
    approvals=ApprovalPolicy(
        approvers={"refund": "role:support-lead", "open_ticket": "asker|role:support-lead"}
    ),
)
