"""A conversation's data: what the `Conversation` workflow takes, keeps and answers.

Plain pydantic models, outside the workflow module, so they are imported once per
worker rather than once per workflow run in Temporal's sandbox.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator
from temporalio.contrib.workflow_streams import WorkflowStreamState

from durable_agent.attachments import Attachment
from durable_agent.model_settings import ModelSettings
from durable_agent.principal import Principal, of_customer
from durable_agent.types import (
    DEFAULT_CUSTOMER,
    MAX_ATTACHMENTS,
    Exchange,
    TurnLimits,
    check_context,
    check_customer_id,
    check_question,
)


class Memory(BaseModel):
    """How much of the conversation each turn is given."""

    max_exchanges: int = Field(default=10, ge=0, le=100)
    max_chars: int = Field(default=8000, ge=0, le=100_000)
    """Questions and answers together; the oldest exchanges go first."""

    max_files: int = Field(default=MAX_ATTACHMENTS, ge=0, le=100)
    """Files of earlier questions a turn is given, the newest first: an older exchange
    past them is kept as its words only."""

    def keep(self, exchanges: list[Exchange]) -> list[Exchange]:
        kept = exchanges[-self.max_exchanges :] if self.max_exchanges else []
        while kept and sum(len(e.question) + len(e.answer) for e in kept) > self.max_chars:
            kept = kept[1:]
        left = self.max_files
        for i in reversed(range(len(kept))):
            files = kept[i].attachments
            if len(files) > left:
                kept[i] = kept[i].model_copy(update={"attachments": []})
            left -= len(kept[i].attachments)
        return kept


class WaitingMessage(BaseModel):
    """A message `send` accepted whose turn has not started yet."""

    text: str
    turn_id: str
    attachments: list[Attachment] = Field(default_factory=list)


class ConversationInput(BaseModel):
    customer_id: str = DEFAULT_CUSTOMER
    agent: str = ""
    """The agent that answers every turn, by name; empty: the worker's first."""
    model: str = ""
    """Model spec for every turn; empty: the agent's default, else the worker's."""

    @field_validator("customer_id")
    @classmethod
    def _customer_id_shape(cls, v: str) -> str:
        return check_customer_id(v)

    principal: Principal | None = None
    """Who converses (`TurnInput.principal`): every turn's; its user is `customer_id`."""

    @property
    def asker(self) -> Principal:
        return self.principal if self.principal is not None else of_customer(self.customer_id)

    @model_validator(mode="after")
    def _customer_is_user(self) -> ConversationInput:
        if self.principal is not None:
            self.customer_id = self.principal.user
        return self

    limits: TurnLimits | None = None
    """Every turn's limits; None: the agent's."""
    memory: Memory = Field(default_factory=Memory)
    idle_timeout: timedelta = Field(
        default=timedelta(minutes=30), gt=timedelta(0), le=timedelta(days=365)
    )
    max_turns_per_run: int = Field(default=100, ge=1, le=10_000)
    """Continue-as-new after this many turns at the latest (Temporal may suggest it
    sooner), so the workflow's own history stays small."""
    exchanges: list[Exchange] = Field(default_factory=list)
    """Carried over continue-as-new: the memory so far."""
    turns: int = 0
    """Carried over continue-as-new: turns so far (numbers the turns' ids)."""
    stream: bool = False
    """Turns publish their models' text as it is written (see `TurnInput.stream`)."""
    stream_state: WorkflowStreamState | None = None
    """Carried over continue-as-new: the conversation's stream (its recent events and
    offsets), so a reader follows it across runs without a gap."""
    waiting: list[WaitingMessage] = Field(default_factory=list)
    """Carried over continue-as-new: messages accepted and not yet answered, in order;
    the new run starts their turns, under the ids they were given."""
    ended: bool = False
    """Carried over continue-as-new: the customer is done; the waiting messages are
    answered, then the conversation ends."""
    context: dict[str, Any] = Field(default_factory=dict)
    """Every turn's context (`TurnInput.context`): who the customer is and where."""
    max_cost: float | None = Field(default=None, ge=0, le=1_000_000)
    """Spending cap of the whole conversation in US dollars, across its turns: each
    turn stops at what is left of it (besides its own `limits.max_cost`)."""
    spent_usd: float = 0.0
    """Carried over continue-as-new: what its turns have cost so far."""
    settings: ModelSettings | None = None
    """Every turn's model settings (`TurnInput.settings`)."""

    @field_validator("context")
    @classmethod
    def _context_shape(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_context(v)


class ChatMessage(BaseModel):
    """Input of `send`."""

    text: str
    attachments: list[Attachment] = Field(default_factory=list, max_length=MAX_ATTACHMENTS)
    """Its files, stored as the conversation's payloads (`AgentClient.chat(...).start`);
    its turn reads them."""

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        return check_question(v)


class MessageAccepted(BaseModel):
    """Output of `send`: the turn that answers the message (follow it, or await it)."""

    turn_id: str
    turn: int
    started: bool = True
    """False: the conversation moved to new code first (continue-as-new onto the
    deployment's current version), and the turn is the new run's first act: it exists
    a moment later, under `turn_id` (`durable_agent.runtime.turns.send` waits for it)."""


class ConversationState(BaseModel):
    customer_id: str
    exchanges: list[Exchange]
    turns: int
    current_turn_id: str | None = None
    ended: bool = False


class ConversationOutput(BaseModel):
    turns: int
    ended_by: str
    """`customer` (the `end` signal) or `idle` (no message within idle_timeout)."""
