"""The demo domain: an e-commerce support shop with orders, returns and policies,
served as an agent through the public API (`shop.agent`)."""

from durable_agent.shop.store import ShopData, ShopStore
from durable_agent.shop.stores import open_store
from durable_agent.shop.tools import TOOLS, TOOLS_WITH_POLICY_EXPERT

__all__ = ["TOOLS", "TOOLS_WITH_POLICY_EXPERT", "ShopData", "ShopStore", "open_store"]
