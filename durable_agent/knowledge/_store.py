"""Where chunks are kept and searched: the `KnowledgeStore` protocol, and its embedded
implementation, SQLite's full-text index (FTS5, ranked by BM25) in one file under the
state folder.

Every worker of one state folder opens the same file: WAL lets them read while one
writes, each write is one transaction (`BEGIN IMMEDIATE`, waiting up to
`BUSY_TIMEOUT_S` for another's), and a source is replaced only if its stored content
hash differs, inside that transaction, so two workers indexing the same change at once
leave one copy of its chunks.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from durable_agent.context_sources import Passage
from durable_agent.knowledge._chunk import Chunk

BUSY_TIMEOUT_S = 30.0
MAX_QUERY_WORDS = 32


class KnowledgeStore(Protocol):
    """Chunks by source, each source with the content hash it was indexed from."""

    def digests(self) -> dict[str, str]:
        """Each indexed source and the hash of the content it was indexed from."""
        ...

    def replace(self, source: str, digest: str, chunks: Sequence[Chunk]) -> bool:
        """The source's chunks become `chunks`, unless it is indexed from `digest`
        already (then nothing changes, and it returns False): idempotent."""
        ...

    def remove(self, source: str) -> None:
        """The source and its chunks, gone (nothing if it was not there)."""
        ...

    def search(self, query: str, limit: int) -> list[Passage]:
        """The chunks that best match the query's words, best first."""
        ...

    def close(self) -> None: ...


def open_database(path: Path) -> sqlite3.Connection:
    """An index's SQLite file (made if new), shared by the workers of one folder: one
    connection, used by one thread at a time (its owner's lock), in WAL mode, waiting
    up to `BUSY_TIMEOUT_S` for another process's write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    db.execute("PRAGMA journal_mode=WAL")
    return db


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """A write transaction: the write lock now, not at the first write."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class SQLiteStore:
    """`KnowledgeStore` in one SQLite file (FTS5, BM25)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_database(path)
        with self._lock, transaction(self._db):
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS sources "
                "(source TEXT PRIMARY KEY, digest TEXT NOT NULL, chunks INTEGER NOT NULL)"
            )
            self._db.execute(
                "CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5("
                "id UNINDEXED, source UNINDEXED, position UNINDEXED, location, text, "
                "tokenize = 'porter unicode61')"
            )

    def digests(self) -> dict[str, str]:
        with self._lock:
            return dict(self._db.execute("SELECT source, digest FROM sources").fetchall())

    def replace(self, source: str, digest: str, chunks: Sequence[Chunk]) -> bool:
        with self._lock, transaction(self._db):
            row = self._db.execute(
                "SELECT digest FROM sources WHERE source = ?", (source,)
            ).fetchone()
            if row is not None and row[0] == digest:
                return False  # another worker indexed this content already
            self._db.execute("DELETE FROM chunks WHERE source = ?", (source,))
            self._db.executemany(
                "INSERT INTO chunks (id, source, position, location, text) VALUES (?, ?, ?, ?, ?)",
                [(c.id, c.source, c.position, c.location, c.text) for c in chunks],
            )
            self._db.execute(
                "INSERT INTO sources (source, digest, chunks) VALUES (?, ?, ?) "
                "ON CONFLICT (source) DO UPDATE SET digest = excluded.digest, "
                "chunks = excluded.chunks",
                (source, digest, len(chunks)),
            )
            return True

    def remove(self, source: str) -> None:
        with self._lock, transaction(self._db):
            self._db.execute("DELETE FROM chunks WHERE source = ?", (source,))
            self._db.execute("DELETE FROM sources WHERE source = ?", (source,))

    def search(self, query: str, limit: int) -> list[Passage]:
        match = fts_query(query)
        if not match:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT id, source, location, text FROM chunks WHERE chunks MATCH ? "
                "ORDER BY bm25(chunks, 0, 0, 0, 2.0, 1.0) LIMIT ?",
                (match, limit),
            ).fetchall()
        return [Passage(id=i, source=s, location=loc, text=t) for i, s, loc, t in rows]

    def count(self) -> int:
        """How many chunks it holds (for tests and logs)."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM chunks").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def fts_query(text: str) -> str:
    """A question's words as an FTS5 query that matches any of them (BM25 ranks the
    chunks with more, and rarer, of them first). Each word is quoted, so nothing a
    person types is FTS5 syntax (`NEAR`, `*`, `"`, column filters)."""
    words = dict.fromkeys(w.lower() for w in re.findall(r"\w+", text))
    return " OR ".join(f'"{w}"' for w in list(words)[:MAX_QUERY_WORDS])
