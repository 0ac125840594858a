"""Where memories are kept: the `MemoryStore` protocol, and its embedded implementation,
one SQLite file under the state folder with a full-text index (FTS5, BM25).

Every row carries its owner (tenant and customer, as the turn's principal recorded
them) and every read and delete names that owner in its `WHERE`: no query of this
module reaches another customer's rows. Every worker of one state folder opens the same
file (WAL; each write one `BEGIN IMMEDIATE` transaction, as knowledge's index).
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from durable_agent.knowledge._store import fts_query, open_database, transaction
from durable_agent.settings import state_dir

MEMORY_ID = r"mem_[0-9a-f]{16}"
"""A memory's id: `mem_` and 16 hex digits of a hash of its owner and the call that
stored it (a passage id, `context_sources.PASSAGE_ID`)."""


class Remembered(BaseModel):
    """One memory: a fact a customer's turn stored, with its owner."""

    id: str
    tenant: str
    customer_id: str
    text: str
    created: float
    """When it was stored (seconds since the epoch)."""
    turn: str = ""
    """The workflow id of the turn that stored it (empty: stored from outside a turn)."""


def memory_id(tenant: str, customer_id: str, key: str) -> str:
    """The id a write of `key` (its idempotency key) for this owner stores under: the same
    for every attempt of one call, so a retried write finds the row it stored."""
    given = "\0".join((tenant, customer_id, key)).encode()
    return "mem_" + hashlib.sha256(given).hexdigest()[:16]


class MemoryStore(Protocol):
    """Memories by owner (tenant, customer): what `Memory` needs of a store."""

    def add(self, memory: Remembered, limit: int) -> tuple[Remembered, bool]:
        """Stores `memory` unless its id is stored already (then the stored one, and
        False: idempotent); `MemoryFull` when its owner has `limit` memories."""
        ...

    def search(self, tenant: str, customer_id: str, query: str, limit: int) -> list[Remembered]:
        """The owner's memories that best match the query's words (BM25, newest first
        among equals), then their newest others, at most `limit`."""
        ...

    def list(self, tenant: str, customer_id: str) -> list[Remembered]:
        """The owner's memories, oldest first."""
        ...

    def forget(self, tenant: str, customer_id: str, memory_id: str) -> bool:
        """The owner's memory `memory_id`, gone; False when the owner has none of that id."""
        ...

    def close(self) -> None: ...


class MemoryFull(Exception):
    """The owner holds as many memories as the store allows."""


class SQLiteMemoryStore:
    """`MemoryStore` in one SQLite file (FTS5, BM25)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_database(path)
        with self._lock, transaction(self._db):
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS memories (id TEXT PRIMARY KEY, "
                "tenant TEXT NOT NULL, customer TEXT NOT NULL, text TEXT NOT NULL, "
                "created REAL NOT NULL, turn TEXT NOT NULL)"
            )
            self._db.execute(
                "CREATE INDEX IF NOT EXISTS memories_owner ON memories (tenant, customer, created)"
            )
            self._db.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS memories_text USING fts5("
                "id UNINDEXED, tenant UNINDEXED, customer UNINDEXED, text, "
                "tokenize = 'porter unicode61')"
            )

    def add(self, memory: Remembered, limit: int) -> tuple[Remembered, bool]:
        with self._lock, transaction(self._db):
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE id = ? AND tenant = ? AND customer = ?",
                (memory.id, memory.tenant, memory.customer_id),
            ).fetchone()
            if row is not None:
                return _remembered(row), False  # this call stored it already
            (held,) = self._db.execute(
                "SELECT count(*) FROM memories WHERE tenant = ? AND customer = ?",
                (memory.tenant, memory.customer_id),
            ).fetchone()
            if held >= limit:
                raise MemoryFull(held)
            owner = (memory.id, memory.tenant, memory.customer_id)
            self._db.execute(
                "INSERT INTO memories (id, tenant, customer, text, created, turn) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (*owner, memory.text, memory.created or time.time(), memory.turn),
            )
            self._db.execute(
                "INSERT INTO memories_text (id, tenant, customer, text) VALUES (?, ?, ?, ?)",
                (*owner, memory.text),
            )
            return memory, True

    def search(self, tenant: str, customer_id: str, query: str, limit: int) -> list[Remembered]:
        match = fts_query(query)
        with self._lock:
            rows = []
            if match:
                rows = self._db.execute(
                    f"SELECT {_COLUMNS_OF_M} FROM memories_text t JOIN memories m ON m.id = t.id "
                    "WHERE memories_text MATCH ? AND t.tenant = ? AND t.customer = ? "
                    "AND m.tenant = ? AND m.customer = ? "
                    "ORDER BY bm25(memories_text), m.created DESC LIMIT ?",
                    (match, tenant, customer_id, tenant, customer_id, limit),
                ).fetchall()
            found = [_remembered(r) for r in rows]
            if len(found) < limit:
                # What the question shares no word with may still be what the customer
                # wants kept in mind (a preference): the newest fill what is left.
                newest = self._db.execute(
                    f"SELECT {_COLUMNS} FROM memories WHERE tenant = ? AND customer = ? "
                    "ORDER BY created DESC LIMIT ?",
                    (tenant, customer_id, limit),
                ).fetchall()
                ids = {m.id for m in found}
                found += [m for m in map(_remembered, newest) if m.id not in ids]
        return found[:limit]

    def list(self, tenant: str, customer_id: str) -> list[Remembered]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE tenant = ? AND customer = ? "
                "ORDER BY created, id",
                (tenant, customer_id),
            ).fetchall()
        return [_remembered(r) for r in rows]

    def forget(self, tenant: str, customer_id: str, memory_id: str) -> bool:
        with self._lock, transaction(self._db):
            owner = (memory_id, tenant, customer_id)
            gone = self._db.execute(
                "DELETE FROM memories WHERE id = ? AND tenant = ? AND customer = ?", owner
            ).rowcount
            self._db.execute(
                "DELETE FROM memories_text WHERE id = ? AND tenant = ? AND customer = ?", owner
            )
        return bool(gone)

    def close(self) -> None:
        with self._lock:
            self._db.close()


_COLUMNS = "id, tenant, customer, text, created, turn"
_COLUMNS_OF_M = "m.id, m.tenant, m.customer, m.text, m.created, m.turn"


def _remembered(row: tuple[str, str, str, str, float, str]) -> Remembered:
    mid, tenant, customer, text, created, turn = row
    return Remembered(
        id=mid, tenant=tenant, customer_id=customer, text=text, created=created, turn=turn
    )


def state_file(name: str = "memory") -> Path:
    """The default store's file: `<state folder>/memory/<name>.sqlite3`."""
    return state_dir() / "memory" / f"{name}.sqlite3"


def in_state_folder(name: str = "memory") -> SQLiteMemoryStore:
    """The default store, its file made if new."""
    return SQLiteMemoryStore(state_file(name))
