"""Ledgers: what a model-call activity asks of the budgets (`activities._model_call.Spending`).

Before the call, `reserve` holds its worst case in the ledger of every budget of the
person the turn serves, starting a ledger with its period's first call
(update-with-start); a budget that cannot hold it refuses the call with
`BudgetExceeded` (the holds already taken are released); one whose soft line the hold
passes, unless the turn was approved to pass it (`ok`), with `BudgetSoftLimit` (all
holds released). After the call, `settle` replaces each hold with the call's cost.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timezone

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.budgets._caps import Budgets, Held
from durable_agent.budgets._ledger import BudgetLedger, LedgerInput, LedgerState, Reserve, Settle
from durable_agent.errors import BudgetExceeded, BudgetSoftLimit
from durable_agent.pricing import format_cost
from durable_agent.principal import Principal

log = logging.getLogger(__name__)

ATTEMPTS = 20
"""Tries of an update the server turns away: it takes ten updates of one workflow at a
time, aborts those in flight while the ledger continues as new, and may be busy. With a
short random pause between, a burst of turns all get in."""

_FINAL = (
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.PERMISSION_DENIED,
    RPCStatusCode.UNAUTHENTICATED,
    RPCStatusCode.UNIMPLEMENTED,
)
"""Answers no second try changes."""


@dataclass(frozen=True)
class Hold:
    """The holds of one model call, one per budget: what `settle` settles."""

    id: str
    ledgers: tuple[str, ...]
    task_queue: str


class Ledgers:
    """The worker's budgets, kept in ledger workflows on the worker's own task queue."""

    def __init__(self, budgets: Budgets) -> None:
        self.budgets = budgets

    def applies(self, who: Principal) -> bool:
        return self.budgets.applies(who)

    async def reserve(
        self, who: Principal, worst: float | None, model: str, ok: Collection[str] = ()
    ) -> Hold:
        info = activity.info()
        held = self.budgets.held(who, datetime.now(timezone.utc))
        if worst is None:
            raise BudgetExceeded(
                f"{held[0].who} cannot be kept: the price of model {model} is unknown "
                "(whoever runs this agent can give it with AGENT_MODEL_PRICES)"
            )
        # One hold per attempt: a retried call holds again, and its failed attempt's hold
        # was released (or, after a crash, stays until the period ends: on the safe side).
        hold = Hold(
            id=f"{info.workflow_id}/{info.workflow_run_id}/{info.activity_id}/{info.attempt}",
            ledgers=tuple(h.ledger for h in held),
            task_queue=info.task_queue,
        )
        client = activity.client()
        taken: list[str] = []
        past: BudgetSoftLimit | None = None
        for budget in held:
            state = await _reserve(client, budget, hold, worst)
            if not state.granted:
                await self._release(client, hold, taken)
                raise BudgetExceeded(budget.line(state.spent, state.held, worst))
            taken.append(budget.ledger)
            unasked = past is None and budget.ledger not in ok
            if unasked and budget.past_soft_line(state.spent, state.held):
                line = budget.soft_line(state.spent, state.held - worst, worst)
                cap = budget.cap
                past = BudgetSoftLimit(
                    line, budget.ledger, state.spent, cap.usd, cap.approver_rules
                )
        if past is not None:  # the hard caps hold it, but a person must say so first
            await self._release(client, hold, taken)
            raise past
        activity.logger.info("budget: %s held in %s", format_cost(worst), ", ".join(taken))
        return hold

    async def settle(self, hold: object, cost: float | None) -> None:
        assert isinstance(hold, Hold)
        client = activity.client()
        for ledger in hold.ledgers:
            await _update(client, ledger, Settle(id=hold.id, cost=cost))

    async def _release(self, client: Client, hold: Hold, ledgers: list[str]) -> None:
        for ledger in ledgers:
            await _update(client, ledger, Settle(id=hold.id, cost=0.0))


async def _reserve(client: Client, budget: Held, hold: Hold, worst: float) -> LedgerState:
    ask = Reserve(id=hold.id, amount=worst, cap=budget.cap.usd)
    for attempt in range(ATTEMPTS):
        start = WithStartWorkflowOperation(
            BudgetLedger.run,
            LedgerInput(ledger=budget.ledger, ends=budget.ends),
            id=budget.ledger,
            task_queue=hold.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary=budget.who,
        )
        try:
            state: LedgerState = await client.execute_update_with_start_workflow(
                BudgetLedger.reserve, ask, start_workflow_operation=start
            )
            return state
        except RPCError as e:
            if e.status in _FINAL or attempt + 1 == ATTEMPTS:
                raise
            await asyncio.sleep(random.uniform(0.02, 0.2))
    raise AssertionError("unreachable")


async def _update(client: Client, ledger: str, bill: Settle) -> None:
    """A settle that cannot be made (the ledger ended with its period, or the server
    kept refusing) is logged: the call is made, and its hold stays counted (on the safe
    side) until the period ends."""
    handle = client.get_workflow_handle_for(BudgetLedger.run, ledger)
    for attempt in range(ATTEMPTS):
        try:
            await handle.execute_update(BudgetLedger.settle, bill)
            return
        except RPCError as e:
            if e.status not in _FINAL and attempt + 1 < ATTEMPTS:
                await asyncio.sleep(random.uniform(0.02, 0.2))
                continue
            log.warning("budget: cannot settle %s in %s: %s", bill.id, ledger, e)
            return
        except Exception as e:  # the ledger closed: its period is over
            log.warning("budget: cannot settle %s in %s: %s", bill.id, ledger, e)
            return
