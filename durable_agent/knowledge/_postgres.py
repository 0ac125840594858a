"""`KnowledgeStore` in PostgreSQL's full-text search, for deployments whose workers share
no folder (the `postgres` extra: psycopg 3).

    Knowledge([...], store=lambda: PostgresStore("postgresql://…/agents", name="helpdesk"))

Two tables, shared by every `Knowledge` of the database and told apart by `name`:
`knowledge_sources` (each source's content hash) and `knowledge_chunks` (its chunks, with
a stored `tsvector` under a GIN index). A source is replaced in one transaction that holds
an advisory lock on it and checks its hash first, so workers indexing the same change at
once leave one copy of its chunks, as with SQLite.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from durable_agent.context_sources import Passage
from durable_agent.errors import KnowledgeError
from durable_agent.knowledge._chunk import Chunk
from durable_agent.knowledge._store import MAX_QUERY_WORDS, nearest, pack, text_hash

SCHEMA = """
CREATE TABLE IF NOT EXISTS knowledge_sources (
    store TEXT NOT NULL, source TEXT NOT NULL, digest TEXT NOT NULL, chunks INTEGER NOT NULL,
    PRIMARY KEY (store, source));
CREATE TABLE IF NOT EXISTS knowledge_chunks (
    store TEXT NOT NULL, id TEXT NOT NULL, source TEXT NOT NULL, position INTEGER NOT NULL,
    location TEXT NOT NULL, text TEXT NOT NULL,
    words tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', location), 'A') ||
        setweight(to_tsvector('english', text), 'B')) STORED,
    PRIMARY KEY (store, id));
CREATE INDEX IF NOT EXISTS knowledge_chunks_words ON knowledge_chunks USING GIN (words);
CREATE INDEX IF NOT EXISTS knowledge_chunks_source ON knowledge_chunks (store, source);
CREATE TABLE IF NOT EXISTS knowledge_vectors (
    store TEXT NOT NULL, hash TEXT NOT NULL, vector BYTEA NOT NULL, PRIMARY KEY (store, hash));
"""


def connect(conninfo: str, what: str, error: type[Exception]) -> Any:
    """An autocommit psycopg connection for `what` (a store); `error` in one line when
    psycopg is not installed or the server cannot be reached."""
    try:
        import psycopg
    except ImportError:
        raise error(
            f"{what} in PostgreSQL needs psycopg: pip install 'durable-agent[postgres]'"
        ) from None
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise error(f"{what}: cannot reach PostgreSQL ({first})") from None


def ts_query(text: str) -> str:
    """A question's words as a `to_tsquery` text that matches any of them; each word its
    own quoted lexeme, so nothing a person types is tsquery syntax."""
    words = list(dict.fromkeys(w.lower() for w in re.findall(r"\w+", text)))
    return " | ".join(f"'{w}'" for w in words[:MAX_QUERY_WORDS])


class PostgresStore:
    """`KnowledgeStore` in PostgreSQL (`conninfo`: a libpq connection string or URL)."""

    def __init__(self, conninfo: str, name: str = "knowledge") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._db: Any = connect(conninfo, f"knowledge {name!r}", KnowledgeError)
        with self._lock, self._db.transaction():
            # One schema change at a time, whichever worker starts first.
            self._db.execute("SELECT pg_advisory_xact_lock(hashtext('durable_agent.knowledge'))")
            self._db.execute(SCHEMA)

    def digests(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT source, digest FROM knowledge_sources WHERE store = %s", (self.name,)
            ).fetchall()
        return dict(rows)

    def replace(self, source: str, digest: str, chunks: Sequence[Chunk]) -> bool:
        with self._lock, self._db.transaction():
            self._db.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (self.name, source)
            )
            row = self._db.execute(
                "SELECT digest FROM knowledge_sources WHERE store = %s AND source = %s",
                (self.name, source),
            ).fetchone()
            if row is not None and row[0] == digest:
                return False
            self._db.execute(
                "DELETE FROM knowledge_chunks WHERE store = %s AND source = %s",
                (self.name, source),
            )
            with self._db.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO knowledge_chunks (store, id, source, position, location, text) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
                    [(self.name, c.id, c.source, c.position, c.location, c.text) for c in chunks],
                )
            self._db.execute(
                "INSERT INTO knowledge_sources (store, source, digest, chunks) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (store, source) DO UPDATE "
                "SET digest = excluded.digest, chunks = excluded.chunks",
                (self.name, source, digest, len(chunks)),
            )
            return True

    def remove(self, source: str) -> None:
        with self._lock, self._db.transaction():
            for table in ("knowledge_chunks", "knowledge_sources"):
                self._db.execute(
                    f"DELETE FROM {table} WHERE store = %s AND source = %s", (self.name, source)
                )

    def search(self, query: str, limit: int) -> list[Passage]:
        terms = ts_query(query)
        if not terms:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT id, source, location, text FROM knowledge_chunks, "
                "to_tsquery('english', %s) AS q WHERE store = %s AND words @@ q "
                "ORDER BY ts_rank_cd(words, q) DESC, id LIMIT %s",
                (terms, self.name, limit),
            ).fetchall()
        return [Passage(id=i, source=s, location=loc, text=t) for i, s, loc, t in rows]

    def unembedded(self, limit: int, dimensions: int) -> dict[str, str]:
        with self._lock:
            self._db.execute(
                "DELETE FROM knowledge_vectors WHERE store = %s AND octet_length(vector) != %s",
                (self.name, dimensions * 4),
            )
            rows = self._db.execute(
                "SELECT text FROM knowledge_chunks WHERE store = %s", (self.name,)
            ).fetchall()
            texts = {text_hash(t): t for (t,) in rows}
            stored = {
                h
                for (h,) in self._db.execute(
                    "SELECT hash FROM knowledge_vectors WHERE store = %s", (self.name,)
                ).fetchall()
            }
            gone = list(stored - set(texts))
            if gone:
                self._db.execute(
                    "DELETE FROM knowledge_vectors WHERE store = %s AND hash = ANY(%s)",
                    (self.name, gone),
                )
        missing = [h for h in texts if h not in stored]
        return {h: texts[h] for h in missing[:limit]}

    def add_vectors(self, vectors: dict[str, Sequence[float]]) -> None:
        with self._lock, self._db.transaction(), self._db.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO knowledge_vectors (store, hash, vector) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                [(self.name, h, pack(v)) for h, v in vectors.items()],
            )

    def nearest(self, vector: Sequence[float], limit: int) -> list[Passage]:
        with self._lock:
            by_hash = dict(
                self._db.execute(
                    "SELECT hash, vector FROM knowledge_vectors WHERE store = %s", (self.name,)
                ).fetchall()
            )
            chunks = self._db.execute(
                "SELECT id, source, location, text FROM knowledge_chunks WHERE store = %s",
                (self.name,),
            ).fetchall()
        rows = [(*c, bytes(by_hash[h])) for c in chunks if (h := text_hash(c[3])) in by_hash]
        return nearest(vector, rows, limit)

    def count(self) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FROM knowledge_chunks WHERE store = %s", (self.name,)
            ).fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
