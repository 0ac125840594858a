"""BudgetLedger: one budget of one period (a tenant's day, a user's month) as one
long-lived workflow, the single place its spend is kept.

    reserve (update)    hold a model call's worst case, if it fits under the cap
    settle (update)     replace a hold with the call's cost (0: the call failed)
    state (query)       the cap, what is spent and what is held

Turns reach it from their model-call activities (`Ledgers`, update-with-start: the first
call of a period starts it). Both updates are plain functions: each is taken whole in
the workflow task that receives it, so concurrent turns see one sum and the ledger never
grants more than the cap minus what is spent and held. It continues as new before its
history grows large, carrying the sums and the open holds, and ends some time after its
period (a hold still open then is dropped with it: the period is over).

Durability notes: deterministic (workflow time only). A hold's id is the model call's
attempt (`Ledgers.reserve`), so an update the client sends again holds once.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel, Field

MAX_UPDATES = 500
"""Updates a ledger's run takes before it continues as new (a few events each): well
inside the 10,240 events at which the server warns."""

AFTER_PERIOD = timedelta(hours=1)
"""How long a ledger stays after its period ends, for the settling of the calls under way."""


class LedgerInput(BaseModel):
    ledger: str
    """The ledger's id, as `ledger_id` builds it (for the Web UI and the logs)."""
    ends: datetime
    """When its period ends (UTC)."""
    spent: float = 0.0
    held: dict[str, float] = Field(default_factory=dict)
    """Open holds by id: carried into the next run."""
    max_updates: int = MAX_UPDATES


class Reserve(BaseModel):
    id: str
    """The model call's attempt (`Ledgers.reserve`): the same id holds once."""
    amount: float
    """The call's worst case, in US dollars."""
    cap: float
    """The budget's cap as the worker's settings say it now (the latest word holds)."""


class Settle(BaseModel):
    id: str
    cost: float | None
    """What the call cost; None: unknown, its hold is counted as spent."""


class LedgerState(BaseModel):
    ledger: str
    cap: float | None = None
    """The cap of the last reservation (None: none yet)."""
    spent: float
    held: float
    holds: int
    granted: bool = True
    """For a reservation: whether it was granted."""


@workflow.defn(name="BudgetLedger", versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class BudgetLedger:
    """Auto-upgrading on versioned workers: a ledger outlives a release (a month), and
    its next workflow task runs on the deployment's current version, so a retired
    version's workers never hold a tenant's budget. Its code stays replay-compatible
    across versions, as the turn's does (`durable_agent/runtime/deployments.py`)."""

    @workflow.init
    def __init__(self, ledger: LedgerInput) -> None:
        self._ledger = ledger.ledger
        self._spent = ledger.spent
        self._held = dict(ledger.held)
        self._cap: float | None = None
        self._updates = 0

    @workflow.run
    async def run(self, ledger: LedgerInput) -> LedgerState:
        left = max(ledger.ends + AFTER_PERIOD - workflow.now(), timedelta(seconds=1))
        try:
            await workflow.wait_condition(
                lambda: (
                    self._updates >= ledger.max_updates
                    or workflow.info().is_continue_as_new_suggested()
                ),
                timeout=left,
            )
        except asyncio.TimeoutError:
            return self.state()  # the period is over: the budget resets with a new ledger
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            ledger.model_copy(update={"spent": self._spent, "held": self._held})
        )

    @workflow.update
    def reserve(self, ask: Reserve) -> LedgerState:
        self._updates += 1
        self._cap = ask.cap
        if ask.id in self._held:
            return self.state()
        fits = self._spent + sum(self._held.values()) + ask.amount <= ask.cap
        if fits:
            self._held[ask.id] = ask.amount
        return self.state().model_copy(update={"granted": fits})

    @workflow.update
    def settle(self, bill: Settle) -> LedgerState:
        self._updates += 1
        held = self._held.pop(bill.id, None)
        if held is not None:
            self._spent += held if bill.cost is None else bill.cost
        return self.state()

    @workflow.query
    def state(self) -> LedgerState:
        return LedgerState(
            ledger=self._ledger,
            cap=self._cap,
            spent=self._spent,
            held=sum(self._held.values()),
            holds=len(self._held),
        )


@workflow.defn(name="BudgetLedger")
class UnversionedBudgetLedger(BudgetLedger):
    """The same ledger for a worker that is no version of a deployment
    (`AGENT_VERSIONING=off`): Temporal refuses a versioning behavior from one."""

    @workflow.run
    async def run(self, ledger: LedgerInput) -> LedgerState:
        return await super().run(ledger)
