"""The demo domain: an e-commerce support shop with orders, returns and policies."""

from shop.store import ShopStore
from shop.tools import TOOLS

__all__ = ["TOOLS", "ShopStore"]
