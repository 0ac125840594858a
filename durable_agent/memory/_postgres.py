"""`MemoryStore` in PostgreSQL, for deployments whose workers share no folder (the
`postgres` extra: psycopg 3), beside knowledge's `PostgresStore`.

    MemorySettings(store=lambda: PostgresMemoryStore("postgresql://…/agents", name="support"))

One table, `agent_memories`, shared by every store of the database and told apart by
`name`; a memory's words are a stored `tsvector` under a GIN index. As in SQLite, every
read and delete names the owner (tenant and customer) in its `WHERE`, and a write holds
an advisory lock on its owner while it counts their memories, so workers storing at
once never pass `max_facts`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from durable_agent.errors import MemoryUnavailable
from durable_agent.knowledge._postgres import connect, ts_query
from durable_agent.memory._store import MemoryFull, Remembered, _remembered

SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_memories (
    store TEXT NOT NULL, id TEXT NOT NULL, tenant TEXT NOT NULL, customer TEXT NOT NULL,
    text TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, turn TEXT NOT NULL,
    words tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    PRIMARY KEY (store, id));
CREATE INDEX IF NOT EXISTS agent_memories_owner
    ON agent_memories (store, tenant, customer, created);
CREATE INDEX IF NOT EXISTS agent_memories_words ON agent_memories USING GIN (words);
"""
_COLUMNS = "id, tenant, customer, text, created, turn"
_OWNER = "store = %s AND tenant = %s AND customer = %s"


class PostgresMemoryStore:
    """`MemoryStore` in PostgreSQL (`conninfo`: a libpq connection string or URL)."""

    def __init__(self, conninfo: str, name: str = "memory") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._db: Any = connect(conninfo, f"memory {name!r}", MemoryUnavailable)
        with self._lock, self._db.transaction():
            # One schema change at a time, whichever worker starts first.
            self._db.execute("SELECT pg_advisory_xact_lock(hashtext('durable_agent.memory'))")
            self._db.execute(SCHEMA)

    def add(self, memory: Remembered, limit: int) -> tuple[Remembered, bool]:
        owner = (self.name, memory.tenant, memory.customer_id)
        with self._lock, self._db.transaction():
            self._db.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))",
                (self.name, f"{memory.tenant}/{memory.customer_id}"),  # a clash only waits
            )
            row = self._db.execute(
                f"SELECT {_COLUMNS} FROM agent_memories WHERE {_OWNER} AND id = %s",
                (*owner, memory.id),
            ).fetchone()
            if row is not None:
                return _remembered(row), False  # this call stored it already
            (held,) = self._db.execute(
                f"SELECT count(*) FROM agent_memories WHERE {_OWNER}", owner
            ).fetchone()
            if held >= limit:
                raise MemoryFull(held)
            self._db.execute(
                "INSERT INTO agent_memories (store, tenant, customer, id, text, created, turn) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (*owner, memory.id, memory.text, memory.created or time.time(), memory.turn),
            )
            return memory, True

    def search(self, tenant: str, customer_id: str, query: str, limit: int) -> list[Remembered]:
        owner = (self.name, tenant, customer_id)
        terms = ts_query(query)
        with self._lock:
            rows = []
            if terms:
                rows = self._db.execute(
                    f"SELECT {_COLUMNS} FROM agent_memories, to_tsquery('english', %s) AS q "
                    f"WHERE {_OWNER} AND words @@ q "
                    "ORDER BY ts_rank_cd(words, q) DESC, created DESC LIMIT %s",
                    (terms, *owner, limit),
                ).fetchall()
            found = [_remembered(r) for r in rows]
            if len(found) < limit:
                # As in SQLite: the newest others fill what is left (a preference seldom
                # shares a word with the question it matters to).
                newest = self._db.execute(
                    f"SELECT {_COLUMNS} FROM agent_memories WHERE {_OWNER} "
                    "ORDER BY created DESC LIMIT %s",
                    (*owner, limit),
                ).fetchall()
                ids = {m.id for m in found}
                found += [m for m in map(_remembered, newest) if m.id not in ids]
        return found[:limit]

    def list(self, tenant: str, customer_id: str) -> list[Remembered]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM agent_memories WHERE {_OWNER} ORDER BY created, id",
                (self.name, tenant, customer_id),
            ).fetchall()
        return [_remembered(r) for r in rows]

    def forget(self, tenant: str, customer_id: str, memory_id: str) -> bool:
        with self._lock:
            gone = self._db.execute(
                f"DELETE FROM agent_memories WHERE {_OWNER} AND id = %s",
                (self.name, tenant, customer_id, memory_id),
            ).rowcount
        return bool(gone)

    def close(self) -> None:
        with self._lock:
            self._db.close()
