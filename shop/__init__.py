"""The demo domain: an e-commerce support shop with orders, returns and policies."""

from shop.store import ShopData, ShopStore
from shop.stores import open_store
from shop.tools import TOOLS

__all__ = ["TOOLS", "ShopData", "ShopStore", "open_store"]
