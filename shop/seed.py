"""The demo shop's sample data (the support agent's test cases refer to it).

Customer `demo` has one order for each of the return rules:

    123456  shipped, no return yet        a return can be started (once)
    234567  delivered, return rtn003      open: asking again gives rtn003
    345678  delivered, return rtn001      refunded: cannot be returned again
    456789  processing                    not shipped: cancel it instead
    678901  delivered, return rtn002      open, still on its way to the warehouse

Order 567890 and return rtn004 belong to another customer, so `demo` never sees them.
"""

from __future__ import annotations

import os
from datetime import date
from importlib import resources

from durable_agent.types import DEFAULT_CUSTOMER

SAMPLE_DAY = date(2026, 11, 24)
"""The day the sample data describes: the demo shop's today, unless `AGENT_SHOP_TODAY`
says otherwise, so order 123456 is three days late however long after it the demo runs."""


def today() -> date:
    """The shop's today: `AGENT_SHOP_TODAY` (`YYYY-MM-DD`, or `system` for the
    machine's date), else `SAMPLE_DAY`."""
    value = os.environ.get("AGENT_SHOP_TODAY", "").strip()
    if not value:
        return SAMPLE_DAY
    if value == "system":
        return date.today()
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"AGENT_SHOP_TODAY={value!r}: use a date (YYYY-MM-DD) or system") from None


OTHER_CUSTOMER = "cust-002"

# order_id, customer_id, item, quantity, total_cents, status, shipped_on, expected_delivery
ORDERS = [
    ("123456", DEFAULT_CUSTOMER, "Herbal Handsoap", 2, 1998, "shipped", "2026-11-18", "2026-11-21"),
    (
        "234567",
        DEFAULT_CUSTOMER,
        "Bamboo Toothbrush Set",
        1,
        1250,
        "delivered",
        "2026-11-02",
        "2026-11-05",
    ),
    (
        "345678",
        DEFAULT_CUSTOMER,
        "Lavender Bath Salts",
        3,
        2685,
        "delivered",
        "2026-10-20",
        "2026-10-23",
    ),
    ("456789", DEFAULT_CUSTOMER, "Electric Toothbrush", 1, 4900, "processing", None, "2026-11-27"),
    (
        "678901",
        DEFAULT_CUSTOMER,
        "Sandalwood Soap Bar",
        2,
        1590,
        "delivered",
        "2026-11-09",
        "2026-11-12",
    ),
    ("567890", OTHER_CUSTOMER, "Cedar Beard Oil", 1, 1800, "shipped", "2026-11-17", "2026-11-20"),
]

# return_id, customer_id, order_id, status, detail
RETURNS = [
    (
        "rtn001",
        DEFAULT_CUSTOMER,
        "345678",
        "processed",
        "Refund of $26.85 issued to your card on 2026-10-30.",
    ),
    (
        "rtn002",
        DEFAULT_CUSTOMER,
        "678901",
        "pending",
        "Waiting for the item to arrive at our warehouse.",
    ),
    (
        "rtn003",
        DEFAULT_CUSTOMER,
        "234567",
        "received",
        "Item received on 2026-11-19; the return will be processed by 2026-11-26.",
    ),
    ("rtn004", OTHER_CUSTOMER, "567890", "processed", "Refund of $18.00 issued on 2026-11-19."),
]


def policies() -> list[tuple[str, str, str]]:
    """(slug, title, body) of each policy document in `shop/policies/`."""
    docs = []
    for f in sorted(
        resources.files("durable_agent.shop").joinpath("policies").iterdir(), key=lambda f: f.name
    ):
        if not f.name.endswith(".md"):
            continue
        lines = f.read_text(encoding="utf-8").strip().splitlines()
        title = lines[0].lstrip("# ").strip()
        docs.append((f.name.removesuffix(".md"), title, " ".join(lines[1:]).strip()))
    return docs
