"""The demo shop's data: orders, returns and policy documents in one SQLite file.

The file is created and seeded the first time a store opens it (idempotently,
so several workers may start at once). Every lookup is scoped to a customer:
another customer's order reads exactly like an unknown one.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from agent.errors import NotAllowed, NotFound
from shop import seed

DEFAULT_DB = Path(__file__).resolve().parent.parent / ".durable-agent" / "shop.db"


def default_db_path() -> Path:
    """`AGENT_SHOP_DB`, else `.durable-agent/shop.db` in the project folder."""
    return Path(os.environ.get("AGENT_SHOP_DB", DEFAULT_DB))


class ShopData(Protocol):
    """What the shop's tools need from a store (SQLite here, DynamoDB in shop/dynamo.py)."""

    def order(self, customer_id: str, order_id: str) -> Order: ...

    def return_(self, customer_id: str, return_id: str) -> Return: ...

    def start_return(
        self, customer_id: str, order_id: str, reason: str, idempotency_key: str
    ) -> Return: ...

    def returns_for(self, order_id: str) -> list[Return]: ...

    def search_policies(self, query: str, limit: int = 2) -> list[PolicyHit]: ...


def open_store() -> ShopData:
    """The store `AGENT_SHOP_STORE` names: `sqlite` (default) or `dynamodb`."""
    kind = os.environ.get("AGENT_SHOP_STORE", "sqlite").strip().lower()
    if kind == "sqlite":
        return ShopStore()
    if kind == "dynamodb":
        from shop.dynamo import DynamoStore

        return DynamoStore()
    raise ValueError(f"AGENT_SHOP_STORE={kind!r}: use sqlite or dynamodb")


class Order(BaseModel):
    order_id: str
    item: str
    quantity: int
    total: str
    status: str
    shipped_on: str | None = None
    expected_delivery: str | None = None


class Return(BaseModel):
    return_id: str
    order_id: str
    status: str
    detail: str


class PolicyHit(BaseModel):
    title: str
    excerpt: str


ORDER_NOT_FOUND = "Order not found. Please check your Order ID."
RETURN_NOT_FOUND = "Return not found. Please check your Return ID."
POLICY_NOT_FOUND = "No store policy covers that. Please contact support."

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, item TEXT NOT NULL,
    quantity INTEGER NOT NULL, total_cents INTEGER NOT NULL, status TEXT NOT NULL,
    shipped_on TEXT, expected_delivery TEXT);
CREATE TABLE IF NOT EXISTS returns (
    return_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, order_id TEXT NOT NULL,
    status TEXT NOT NULL, detail TEXT NOT NULL);
CREATE VIRTUAL TABLE IF NOT EXISTS policies USING fts5(slug UNINDEXED, title, body);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, return_id TEXT NOT NULL REFERENCES returns(return_id));
"""

_FTS_STOPWORDS = frozenset(
    [
        "and",
        "are",
        "can",
        "does",
        "for",
        "from",
        "have",
        "how",
        "long",
        "many",
        "much",
        "the",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    ]
)


class ShopStore:
    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")  # several workers may seed at once
            self._seed(db)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # One short-lived connection per operation: tools run in threads, and
        # sqlite3 connections must not be shared between them.
        # Autocommit mode; `with db:` below commits (or rolls back) what a
        # `BEGIN IMMEDIATE` started.
        db = sqlite3.connect(self.path, timeout=10, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            with db:
                yield db
        finally:
            db.close()

    @staticmethod
    def _seed(db: sqlite3.Connection) -> None:
        db.executemany("INSERT OR IGNORE INTO orders VALUES (?,?,?,?,?,?,?,?)", seed.ORDERS)
        db.executemany("INSERT OR IGNORE INTO returns VALUES (?,?,?,?,?)", seed.RETURNS)
        if db.execute("SELECT count(*) FROM policies").fetchone()[0] == 0:
            db.executemany("INSERT INTO policies VALUES (?,?,?)", seed.policies())

    def order(self, customer_id: str, order_id: str) -> Order:
        with self._connect() as db:
            row = db.execute(
                "SELECT * FROM orders WHERE order_id = ? AND customer_id = ?",
                (order_id, customer_id),
            ).fetchone()
        if row is None:
            raise NotFound(ORDER_NOT_FOUND)
        return Order(
            order_id=row["order_id"],
            item=row["item"],
            quantity=row["quantity"],
            total=f"${row['total_cents'] / 100:.2f}",
            status=row["status"],
            shipped_on=row["shipped_on"],
            expected_delivery=row["expected_delivery"],
        )

    def return_(self, customer_id: str, return_id: str) -> Return:
        with self._connect() as db:
            row = db.execute(
                "SELECT return_id, order_id, status, detail FROM returns "
                "WHERE return_id = ? AND customer_id = ?",
                (return_id, customer_id),
            ).fetchone()
        if row is None:
            raise NotFound(RETURN_NOT_FOUND)
        return Return(**dict(row))

    def start_return(
        self, customer_id: str, order_id: str, reason: str, idempotency_key: str
    ) -> Return:
        """Create a return for one of the customer's orders, exactly once per key.

        The key and the new return are written in one transaction, and a call
        with a key already used returns the first call's return: a retried or
        re-run dispatch never creates a second return.
        """
        with self._connect() as db:
            # Take the write lock first so two calls with one key cannot both miss it.
            db.execute("BEGIN IMMEDIATE")
            done = db.execute(
                "SELECT r.return_id, r.order_id, r.status, r.detail FROM idempotency i "
                "JOIN returns r USING (return_id) WHERE i.key = ?",
                (idempotency_key,),
            ).fetchone()
            if done is not None:
                return Return(**dict(done))
            order = db.execute(
                "SELECT status FROM orders WHERE order_id = ? AND customer_id = ?",
                (order_id, customer_id),
            ).fetchone()
            if order is None:
                raise NotFound(ORDER_NOT_FOUND)
            if order["status"] not in ("shipped", "delivered"):
                raise NotAllowed(
                    f"Order {order_id} has not shipped yet, so it cannot be returned; "
                    "it can be cancelled free of charge instead."
                )
            last = db.execute(
                "SELECT max(CAST(substr(return_id, 4) AS INTEGER)) FROM returns"
            ).fetchone()[0]
            ret = Return(
                return_id=f"rtn{(last or 0) + 1:03d}",
                order_id=order_id,
                status="requested",
                detail=f"Requested on {date.today().isoformat()} ({reason.strip()[:200]}). "
                "Ship the item back with the prepaid label we emailed you.",
            )
            db.execute(
                "INSERT INTO returns VALUES (?,?,?,?,?)",
                (ret.return_id, customer_id, ret.order_id, ret.status, ret.detail),
            )
            db.execute("INSERT INTO idempotency VALUES (?,?)", (idempotency_key, ret.return_id))
            return ret

    def returns_for(self, order_id: str) -> list[Return]:
        """Every return of an order (for operators and tests)."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT return_id, order_id, status, detail FROM returns WHERE order_id = ?",
                (order_id,),
            ).fetchall()
        return [Return(**dict(r)) for r in rows]

    def search_policies(self, query: str, limit: int = 2) -> list[PolicyHit]:
        terms = [
            w
            for w in re.findall(r"[a-z0-9]+", query.lower())
            if len(w) > 2 and w not in _FTS_STOPWORDS
        ]
        if not terms:
            raise NotFound(POLICY_NOT_FOUND)
        # Prefix match on each word, any word may match; bm25 ranks the documents.
        match = " OR ".join(f'"{t}"*' for t in terms)
        with self._connect() as db:
            rows = db.execute(
                "SELECT title, snippet(policies, 2, '', '', '…', 40) AS excerpt "
                "FROM policies WHERE policies MATCH ? ORDER BY bm25(policies) LIMIT ?",
                (match, limit),
            ).fetchall()
        if not rows:
            raise NotFound(POLICY_NOT_FOUND)
        return [PolicyHit(title=r["title"], excerpt=r["excerpt"]) for r in rows]
