"""The tools the peers call: the demo shop's order and return lookups.

The same store and the same customer as the agent's `order_status` and
`return_status`, so every system reads the same row. The worker opens the store once
(`open_shop`) before any tool runs; tools run in threads, which the store allows.
"""

from __future__ import annotations

from pathlib import Path

from durable_agent.shop.store import Order, Return, ShopStore
from durable_agent.types import DEFAULT_CUSTOMER

_store: ShopStore | None = None


def open_shop(path: Path) -> None:
    """Open (and seed, the first time) the shop's SQLite file for this process."""
    global _store
    _store = ShopStore(path)


def order(order_id: str) -> Order:
    return _shop().order(DEFAULT_CUSTOMER, order_id)


def return_(return_id: str) -> Return:
    return _shop().return_(DEFAULT_CUSTOMER, return_id.lower())


def _shop() -> ShopStore:
    if _store is None:
        raise RuntimeError("the shop is not open: the worker calls open_shop() first")
    return _store
