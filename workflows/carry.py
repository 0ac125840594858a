"""What a turn carries from one run into the next when it continues as new.

A long turn's history would outgrow Temporal's limits (51,200 events, 50 MB), so
the turn continues as new at a safe point once its history nears them: between
rounds of calls, or while every call of a round not yet done waits for a person.
The next run starts where this one stopped, by the same workflow id, from a
`TurnCarry` in its input (`TurnInput.carry`):

- the loop's place: the round's calls (the model's reply), its iteration (so step
  numbers and the idempotency keys built from them never repeat), and, in a round
  under way, the results so far and the calls awaiting consent (and any decision
  already taken on them);
- the totals: usage and cost, tools used, the turn's clock (max_duration, with the
  time spent waiting for people left out), whether a result carried instructions,
  which writes ran without asking (hashes: a copy of one asks in any run), and which
  MCP servers a person let use the agent's model (or not);
- the conversation's length only: the model calls number on, and the activities
  read the conversation from their worker's copy or from the earlier runs'
  histories (`durable_agent/transcript.py`), so no run's input carries it;
- the story: the steps the run before recorded (each run's are in the next run's
  input, and the client puts them together), and the stream's recent events with
  their offsets;
- in a fork (`durable_agent/rewind.py`), what its parent's record has answered so far.

Every field holds what one run adds, never the whole turn: a turn of N steps writes
O(N) bytes over all its runs (but for the short lists that are the turn's memory:
the calls consented to, and at most 1,000 hashes of writes run without asking).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio.contrib.workflow_streams import WorkflowStreamState

from durable_agent.activities.calls import ValidCall
from durable_agent.approval import ApprovalDecision
from durable_agent.model import Reply
from durable_agent.rewind import Served
from durable_agent.types import (
    LEAN,
    AgentInfo,
    Observation,
    PendingApproval,
    Step,
    StepKind,
    TurnInput,
    Usage,
)


class CarriedRound(BaseModel):
    """A round of calls under way: every call not done waits for a person's consent."""

    valid: list[ValidCall]
    """The round's calls that passed parse and the shields, in order: a call's place
    here is its index in the idempotency key."""
    done: dict[str, Observation] = Field(default_factory=dict)
    """The round's results so far, by call id (rejected and blocked calls included)."""


class TurnCarry(BaseModel):
    run: int
    """This run's number: 2 for the first that continues the turn."""
    agent: AgentInfo
    steps: list[Step] = Field(default_factory=list)
    """The steps the run before recorded (its own only)."""
    steps_before: int = 0
    """The steps all earlier runs recorded, `steps` included."""
    usage: Usage
    model: str = ""
    tools_used: list[str] = Field(default_factory=list)
    tainted: bool = False
    status: str = ""
    """The turn's AgentStatus search attribute, as the run before left it."""
    model_calls: int = 0
    """Model calls so far: the next one is numbered after them."""
    sent: int = 0
    """Messages of the conversation the model calls so far have carried."""
    consented: list[str] = Field(default_factory=list)
    """Calls a person granted consent to (a summary of the conversation keeps them)."""
    budget_ok: list[str] = Field(default_factory=list)
    """Budgets (ledger ids) a person let the turn pass the soft line of (`budget_ok`)."""
    unasked: list[str] = Field(default_factory=list)
    """The writes the turn ran without asking, as hashes (`approval.digest`, at most
    `approval.MAX_UNASKED_WRITES`): a copy of one asks, in every run."""
    may_sample: dict[str, bool] = Field(default_factory=dict)
    """The MCP servers a person let use the agent's model in this turn (True) or not
    (False): asked once per server per turn, whatever its runs."""
    started: datetime | None = None
    paused: timedelta = timedelta(0)
    paused_since: datetime | None = None
    iteration: int = 1
    replans: int = 0
    source: StepKind = StepKind.PLAN
    reply: Reply
    """The model's reply whose calls are this round's."""
    round: CarriedRound | None = None
    """The round under way (None: it starts in the new run)."""
    models: list[str] = Field(default_factory=list)
    """The models the turn still asks, in order (one that failed is asked no more)."""
    instructions: str = ""
    """Instructions evaluated for this turn (an agent's function): not evaluated again."""
    pending: list[PendingApproval] = Field(default_factory=list)
    decisions: list[ApprovalDecision] = Field(default_factory=list)
    """Decisions on pending calls that came as the run before ended."""
    stream: WorkflowStreamState | None = None
    served: Served | None = None
    """In a fork: what its record has answered so far (a write it was answered with is
    not answered again; a replay's place in the recording)."""

    @classmethod
    def of(cls, turn: TurnInput) -> TurnCarry | None:
        return None if turn.carry is None else cls.model_validate(turn.carry)

    def input(self, turn: TurnInput) -> TurnInput:
        """The next run's input: the turn's own, and this (its steps without the lines
        a reader rebuilds from what they hold, as a stored result has them)."""
        carried = self.model_dump(mode="json", context={LEAN: True})
        update: dict[str, object] = {"carry": carried}
        if turn.fork is not None:
            # A fork's start (its parent's conversation and steps) is its first run's
            # alone: later runs need only the parent's recorded calls.
            update["fork"] = turn.fork.model_copy(update={"messages": [], "steps": []})
        return turn.model_copy(update=update)
