"""The demo domain: an e-commerce support shop with orders, returns and policies."""

from shop.store import ShopData, ShopStore
from shop.stores import open_store
from shop.tools import TOOLS, TOOLS_WITH_POLICY_EXPERT, shop_tools

__all__ = ["TOOLS", "TOOLS_WITH_POLICY_EXPERT", "ShopData", "ShopStore", "open_store", "shop_tools"]
