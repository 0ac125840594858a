"""`open_store`: the one place that picks a store, so neither store imports the other.

AGENT_SHOP_STORE=sqlite      the SQLite file (default; see shop/store.py)
AGENT_SHOP_STORE=dynamodb    DynamoDB tables (see shop/dynamo.py; needs the `aws` extra)
"""

from __future__ import annotations

import os

from durable_agent.shop.store import ShopData, ShopStore


def open_store() -> ShopData:
    """The store `AGENT_SHOP_STORE` names: `sqlite` (default) or `dynamodb`."""
    kind = os.environ.get("AGENT_SHOP_STORE", "sqlite").strip().lower()
    if kind == "sqlite":
        return ShopStore()
    if kind == "dynamodb":
        # Imported here: boto3 is an optional dependency (`pip install -e ".[aws]"`).
        from durable_agent.shop.dynamo import DynamoStore

        return DynamoStore()
    raise ValueError(f"AGENT_SHOP_STORE={kind!r}: use sqlite or dynamodb")
