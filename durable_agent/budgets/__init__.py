"""Budgets that nothing bypasses: spend caps in US dollars per tenant or user, per UTC
day or month, kept by one ledger workflow per budget and period, that every model call
of a turn (its sub-agents' and MCP sampling included) reserves from before it is made."""

from durable_agent.budgets._caps import (
    SETTING,
    Budgets,
    BudgetSettingError,
    Cap,
    ledger_id,
    period_of,
    user_key,
)
from durable_agent.budgets._ledger import (
    BudgetLedger,
    LedgerInput,
    LedgerState,
    Reserve,
    Settle,
    UnversionedBudgetLedger,
)
from durable_agent.budgets._ledgers import Ledgers

__all__ = [
    "SETTING",
    "BudgetLedger",
    "BudgetSettingError",
    "Budgets",
    "Cap",
    "LedgerInput",
    "LedgerState",
    "Ledgers",
    "Reserve",
    "Settle",
    "UnversionedBudgetLedger",
    "ledger_id",
    "period_of",
    "user_key",
]
