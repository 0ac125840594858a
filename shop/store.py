"""The demo shop's data: orders, returns and policy documents in one SQLite file.

Also the contract every store keeps (`ShopData`, the records, the messages and
the return rules), so that `shop/dynamo.py` imports from here and nothing
imports back; `shop/stores.py` picks one of the two.

The file is created and seeded the first time a store opens it (idempotently,
so several workers may start at once). Every lookup is scoped to a customer:
another customer's order reads exactly like an unknown one.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from durable_agent.errors import NotAllowed, NotFound
from durable_agent.settings import state_dir
from durable_agent.shop import seed


def default_db_path() -> Path:
    """`AGENT_SHOP_DB`, else `shop.db` in the state folder (`.durable-agent/` in the
    current folder, or AGENT_STATE_DIR)."""
    return Path(os.environ.get("AGENT_SHOP_DB", "").strip() or state_dir() / "shop.db")


# --- the contract ---------------------------------------------------------------------


class ShopData(Protocol):
    """What the shop's tools need from a store (SQLite here, DynamoDB in shop/dynamo.py).

    `start_return` keeps the return rules (`existing_return`, `clean_reason`) even
    against concurrent calls, and gives a call with a key already used the
    first call's return: a re-run dispatch never writes twice.
    """

    def order(self, customer_id: str, order_id: str) -> Order: ...

    def orders(self, customer_id: str) -> list[Order]: ...

    def return_(self, customer_id: str, return_id: str) -> Return: ...

    def start_return(
        self, customer_id: str, order_id: str, reason: str, idempotency_key: str
    ) -> Return: ...

    def returns_for(self, order_id: str) -> list[Return]: ...

    def search_policies(self, query: str, limit: int = 2) -> list[PolicyHit]: ...


class Order(BaseModel):
    order_id: str
    item: str
    quantity: int
    total: str
    status: str
    shipped_on: str | None = None
    expected_delivery: str | None = None
    days_late: int | None = None
    """Days past its expected delivery, for an order not delivered yet (by the store's
    clock); None when it is not late."""
    returns: str | None = None
    """The order's returns, with their status and what happened ("rtn001 (processed:
    Refund of $26.85 issued ...)"), if it has any."""


Clock = Callable[[], date]
"""The store's today (`seed.today` unless a test or an operator gives another)."""


def make_order(row: Mapping[str, Any], returns: list[Return], today: date) -> Order:
    """An order as both stores give it, from its stored fields."""
    expected = row.get("expected_delivery")
    late = None
    if expected and row["status"] != "delivered":
        days = (today - date.fromisoformat(str(expected))).days
        late = days if days > 0 else None
    return Order(
        order_id=row["order_id"],
        item=row["item"],
        quantity=int(row["quantity"]),
        total=f"${int(row['total_cents']) / 100:.2f}",
        status=row["status"],
        shipped_on=row.get("shipped_on"),
        expected_delivery=expected,
        days_late=late,
        returns=returns_of(returns),
    )


def returns_of(returns: list[Return]) -> str | None:
    """`Order.returns` from the order's returns, oldest first."""
    ordered = sorted(returns, key=lambda r: int(r.return_id[3:]))
    return "; ".join(f"{r.return_id} ({r.status}: {r.detail.rstrip('.')})" for r in ordered) or None


class Return(BaseModel):
    return_id: str
    order_id: str
    status: str
    detail: str


class PolicyHit(BaseModel):
    title: str
    excerpt: str
    """Whole sentences of the document, those that best match the query."""


ORDER_NOT_FOUND = "Order not found. Please check your Order ID."
RETURN_NOT_FOUND = "Return not found. Please check your Return ID."
POLICY_NOT_FOUND = "No store policy covers that. Please contact support."

# --- the return rules (both stores) ---------------------------------------------------

SHIPPED = ("shipped", "delivered")
"""Order statuses that can be returned."""
REFUNDED = ("processed", "refunded")
"""Return statuses after which the order cannot be returned again; every other
status (requested, pending, received) is an open return."""
MAX_REASON_CHARS = 160
"""The reason is kept inside the return's detail, which the model reads back
on every later step: a paragraph pasted by the customer must not ride along."""


def existing_return(order_id: str, order_status: str, latest: Return | None) -> Return | None:
    """Apply the rules to an order and its latest return: that return if it is
    still open (a repeated request gets it back instead of a second one), None
    if a new return may be started. An order has at most one open return, and
    none after a refunded one, so its latest return is all the rules need."""
    if latest is not None and latest.status not in REFUNDED:
        return latest
    if latest is not None:
        raise NotAllowed(
            f"Order {order_id} was already returned and refunded (return {latest.return_id}), "
            f"so it cannot be returned again; ask about return {latest.return_id} "
            "for the refund's details."
        )
    if order_status not in SHIPPED:
        raise NotAllowed(
            f"Order {order_id} has not shipped yet, so it cannot be returned; "
            "you can cancel it free of charge until it ships instead."
        )
    return None


def clean_reason(order_id: str, reason: str) -> str:
    """The customer's reason on one line, capped at a word boundary; a blank one
    is refused, since the warehouse needs it to handle the item."""
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split()).strip(" .")
    if not any(c.isalnum() for c in text):
        raise NotAllowed(
            f"Please say why order {order_id} is going back (for example: arrived damaged, "
            "wrong size), then ask again to start the return."
        )
    if len(text) <= MAX_REASON_CHARS:
        return text
    cut = text[: MAX_REASON_CHARS - 1]
    if " " in cut[MAX_REASON_CHARS // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:.-") + "…"


def new_return(return_id: str, order_id: str, reason: str, today: date) -> Return:
    """A freshly requested return; `reason` as `clean_reason` left it."""
    return Return(
        return_id=return_id,
        order_id=order_id,
        status="requested",
        detail=f"Requested on {today.isoformat()} ({reason}). "
        "Ship the item back with the prepaid label we emailed you.",
    )


# --- policy search --------------------------------------------------------------------

# Words that say nothing about which document answers: question words, pronouns,
# and "policy" itself (every document is one).
_QUERY_STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "for",
        "from",
        "get",
        "got",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "just",
        "know",
        "let",
        "long",
        "me",
        "much",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "please",
        "policies",
        "policy",
        "shall",
        "should",
        "so",
        "some",
        "tell",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "too",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(])")
# Titles weigh four times the body: a document named for the topic ranks first.
_TITLE_WEIGHT, _BODY_WEIGHT = 4.0, 1.0
SENTENCES_PER_HIT = 2
OPENING_SENTENCES = 3
"""What a question about a whole policy ("What is your return policy?") gets: the
document's opening, which states it, rather than the sentences that repeat a word."""
_WHOLE_POLICY = re.compile(r"\b(?:polic(?:y|ies)|rules|terms)\b", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """The sentences of a policy text (documents are plain prose, no abbreviations)."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


# "ship to Germany", "deliver in Japan": a place the documents may not name, but
# their sentence about which countries they deliver to answers.
_TO_A_PLACE = re.compile(r"\b(?:ship|send|deliver|post|mail)\w*\s+(?:it\s+)?(?:to|in)\s+[A-Z]")
_PLACE_TERMS = ("countries", "internationally")


def match_expression(query: str) -> str:
    """An FTS5 query matching any of the question's content words. Each word is
    quoted, so FTS5 operators typed by a customer ("NOT", "*") are just words,
    and the porter tokenizer stems them as it stemmed the documents."""
    words = re.findall(r"[a-z0-9]+", query.lower())
    if _TO_A_PLACE.search(query):
        words += _PLACE_TERMS
    terms = dict.fromkeys(w for w in words if w not in _QUERY_STOPWORDS)
    if not terms:
        raise NotFound(POLICY_NOT_FOUND)
    return " OR ".join(f'"{t}"' for t in terms)


# --- the SQLite store -----------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, item TEXT NOT NULL,
    quantity INTEGER NOT NULL, total_cents INTEGER NOT NULL, status TEXT NOT NULL,
    shipped_on TEXT, expected_delivery TEXT);
CREATE TABLE IF NOT EXISTS returns (
    return_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, order_id TEXT NOT NULL,
    status TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS returns_by_order ON returns (order_id);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY, return_id TEXT NOT NULL REFERENCES returns(return_id));
CREATE TABLE IF NOT EXISTS policy_index (fingerprint TEXT NOT NULL);
"""

# The policy index: per document a title row (n = 0, `title` set) and a row per
# sentence (n = 1, 2, ..., `sentence` set). Porter stemming: "returning" finds "returns".
_POLICY_INDEX = (
    "CREATE VIRTUAL TABLE policy_text USING fts5("
    "slug UNINDEXED, n UNINDEXED, title, sentence, tokenize = 'porter unicode61')"
)

_RETURN_COLUMNS = "return_id, order_id, status, detail"


class ShopStore:
    def __init__(
        self, path: str | os.PathLike[str] | None = None, today: Clock = seed.today
    ) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self.today = today
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
        # REPLACE, not IGNORE: a file seeded by an older version gets today's
        # sample facts (the store itself never changes a sample row).
        db.executemany("INSERT OR REPLACE INTO orders VALUES (?,?,?,?,?,?,?,?)", seed.ORDERS)
        db.executemany("INSERT OR REPLACE INTO returns VALUES (?,?,?,?,?)", seed.RETURNS)
        _index_policies(db)

    def order(self, customer_id: str, order_id: str) -> Order:
        with self._connect() as db:
            row = db.execute(
                "SELECT * FROM orders WHERE order_id = ? AND customer_id = ?",
                (order_id, customer_id),
            ).fetchone()
            returns = db.execute(
                f"SELECT {_RETURN_COLUMNS} FROM returns WHERE order_id = ? AND customer_id = ?",
                (order_id, customer_id),
            ).fetchall()
        if row is None:
            raise NotFound(ORDER_NOT_FOUND)
        return make_order(dict(row), [Return(**dict(r)) for r in returns], self.today())

    def orders(self, customer_id: str) -> list[Order]:
        """The customer's orders, newest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT * FROM orders WHERE customer_id = ? "
                "ORDER BY coalesce(shipped_on, '9999') DESC, order_id DESC",
                (customer_id,),
            ).fetchall()
            returns = db.execute(
                f"SELECT {_RETURN_COLUMNS} FROM returns WHERE customer_id = ?", (customer_id,)
            ).fetchall()
        by_order: dict[str, list[Return]] = defaultdict(list)
        for r in returns:
            by_order[r["order_id"]].append(Return(**dict(r)))
        today = self.today()
        return [make_order(dict(row), by_order[row["order_id"]], today) for row in rows]

    def return_(self, customer_id: str, return_id: str) -> Return:
        with self._connect() as db:
            row = db.execute(
                f"SELECT {_RETURN_COLUMNS} FROM returns WHERE return_id = ? AND customer_id = ?",
                (return_id, customer_id),
            ).fetchone()
        if row is None:
            raise NotFound(RETURN_NOT_FOUND)
        return Return(**dict(row))

    def start_return(
        self, customer_id: str, order_id: str, reason: str, idempotency_key: str
    ) -> Return:
        """Start a return for one of the customer's orders, exactly once per key.

        Everything happens under the write lock, in one transaction: the key
        lookup, the rules (`existing_return`) and the writes. So a call with a
        key already used gets the first call's return, and two calls for one
        order, whatever their keys, leave one open return.
        """
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            done = db.execute(
                f"SELECT {_RETURN_COLUMNS} FROM idempotency JOIN returns USING (return_id) "
                "WHERE key = ?",
                (idempotency_key,),
            ).fetchone()
            if done is not None:
                return Return(**dict(done))
            status = _order_status(db, customer_id, order_id)
            ret = existing_return(order_id, status, _latest_return(db, order_id))
            if ret is None:
                ret = new_return(
                    _next_return_id(db), order_id, clean_reason(order_id, reason), self.today()
                )
                db.execute(
                    "INSERT INTO returns VALUES (?,?,?,?,?)",
                    (ret.return_id, customer_id, ret.order_id, ret.status, ret.detail),
                )
            # The key remembers an existing return too: a re-run gets what the first run got.
            db.execute("INSERT INTO idempotency VALUES (?,?)", (idempotency_key, ret.return_id))
            return ret

    def returns_for(self, order_id: str) -> list[Return]:
        """Every return of an order (for operators and tests)."""
        with self._connect() as db:
            rows = db.execute(
                f"SELECT {_RETURN_COLUMNS} FROM returns WHERE order_id = ?", (order_id,)
            ).fetchall()
        return [Return(**dict(r)) for r in rows]

    def search_policies(self, query: str, limit: int = 2) -> list[PolicyHit]:
        """The best matching documents first, each with its best matching
        sentences in reading order (see `_rank_documents`)."""
        match = match_expression(query)
        with self._connect() as db:
            rows = db.execute(
                "SELECT slug, n, bm25(policy_text, 0, 0, ?, ?) AS score FROM policy_text "
                "WHERE policy_text MATCH ? ORDER BY score",
                (_TITLE_WEIGHT, _BODY_WEIGHT, match),
            ).fetchall()
            ranked = _rank_documents(rows, limit, whole=bool(_WHOLE_POLICY.search(query)))
            hits = [_hit(db, slug, numbers) for slug, numbers in ranked]
        if not hits:
            raise NotFound(POLICY_NOT_FOUND)
        return hits


def _order_status(db: sqlite3.Connection, customer_id: str, order_id: str) -> str:
    row = db.execute(
        "SELECT status FROM orders WHERE order_id = ? AND customer_id = ?",
        (order_id, customer_id),
    ).fetchone()
    if row is None:
        raise NotFound(ORDER_NOT_FOUND)
    return str(row["status"])


def _latest_return(db: sqlite3.Connection, order_id: str) -> Return | None:
    row = db.execute(
        f"SELECT {_RETURN_COLUMNS} FROM returns WHERE order_id = ? "
        "ORDER BY CAST(substr(return_id, 4) AS INTEGER) DESC LIMIT 1",
        (order_id,),
    ).fetchone()
    return Return(**dict(row)) if row else None


def _next_return_id(db: sqlite3.Connection) -> str:
    last = db.execute("SELECT max(CAST(substr(return_id, 4) AS INTEGER)) FROM returns").fetchone()
    return f"rtn{(last[0] or 0) + 1:03d}"


def _rank_documents(
    rows: list[sqlite3.Row], limit: int, whole: bool = False
) -> list[tuple[str, list[int]]]:
    """Documents by the sum of their matching rows' scores, each with the numbers
    of the sentences for its excerpt.

    The index holds a row per title and per sentence, not per document: with a
    handful of documents, a word found in most of them ("return", "order") gets
    an inverse document frequency of about zero and bm25 cannot rank at all,
    while across some thirty rows it still tells the documents apart. `rows`
    come best first (bm25 is lower for better matches).
    """
    score: dict[str, float] = defaultdict(float)
    matched: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        score[row["slug"]] += row["score"]
        matched[row["slug"]].append(row["n"])
    ranked = sorted(score, key=score.__getitem__)[:limit]
    return [(slug, _excerpt_sentences(matched[slug], whole)) for slug in ranked]


def _excerpt_sentences(matched: list[int], whole: bool = False) -> list[int]:
    """The best matching sentences, in reading order. A matching title stands for
    the opening sentence: a question about the document's topic ("return
    policy") is answered by the sentence that states the policy, not by the one
    that repeats the word most often; asked for the whole policy, by the opening."""
    if whole and 0 in matched:
        return list(range(1, OPENING_SENTENCES + 1))
    best = dict.fromkeys(n or 1 for n in matched)
    return sorted(list(best)[:SENTENCES_PER_HIT])


def _hit(db: sqlite3.Connection, slug: str, numbers: list[int]) -> PolicyHit:
    rows = db.execute("SELECT n, title, sentence FROM policy_text WHERE slug = ?", (slug,))
    text = {row["n"]: (row["title"] or row["sentence"]) for row in rows}
    return PolicyHit(title=text[0], excerpt=" ".join(text[n] for n in numbers if n in text))


def _index_policies(db: sqlite3.Connection) -> None:
    """(Re)build the policy index when the documents or the index's definition
    changed since it was built, so an old file never serves stale answers."""
    docs = seed.policies()
    fingerprint = hashlib.sha256(repr((_POLICY_INDEX, docs)).encode()).hexdigest()
    if db.execute("SELECT 1 FROM policy_index WHERE fingerprint = ?", (fingerprint,)).fetchone():
        return
    db.execute("DROP TABLE IF EXISTS policies")  # an older version's index
    db.execute("DROP TABLE IF EXISTS policy_text")
    db.execute(_POLICY_INDEX)
    for slug, title, body in docs:
        db.execute("INSERT INTO policy_text VALUES (?, 0, ?, '')", (slug, title))
        db.executemany(
            "INSERT INTO policy_text VALUES (?, ?, '', ?)",
            [(slug, n, text) for n, text in enumerate(sentences(body), 1)],
        )
    db.execute("DELETE FROM policy_index")
    db.execute("INSERT INTO policy_index VALUES (?)", (fingerprint,))
