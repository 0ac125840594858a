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

import hashlib
import math
import re
import sqlite3
import threading
from array import array
from collections.abc import Iterable, Iterator, Sequence
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


class VectorStore(Protocol):
    """A `KnowledgeStore` that keeps a vector beside each chunk's text, by the hash of
    that text (`text_hash`), for `Knowledge(embed=...)`: one vector per distinct text,
    so an edit embeds only the chunks it changed."""

    def unembedded(self, limit: int, dimensions: int) -> dict[str, str]:
        """At most `limit` chunks' texts with no vector yet, by their `text_hash`; vectors
        no chunk has any more, and vectors of another length than `dimensions` (another
        function's), are dropped first."""
        ...

    def add_vectors(self, vectors: dict[str, Sequence[float]]) -> None:
        """Vectors by their texts' hash (idempotent: a vector stored already stays)."""
        ...

    def nearest(self, vector: Sequence[float], limit: int) -> list[Passage]:
        """The chunks whose vectors are nearest to `vector` (cosine), best first."""
        ...


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def pack(vector: Sequence[float]) -> bytes:
    """A vector as stored: float32s, little-endian."""
    packed = array("f", vector)
    return packed.tobytes()


def nearest(
    query: Sequence[float], rows: Iterable[tuple[str, str, str, str, bytes]], limit: int
) -> list[Passage]:
    """The rows (id, source, location, text, packed vector) nearest to `query` by cosine,
    best first. A brute-force scan: the hook is for an index of a team's documents (tens
    of thousands of chunks), not for millions."""
    q = list(query)
    q_norm = math.sqrt(sum(x * x for x in q)) or 1.0
    scored = []
    for i, s, loc, t, blob in rows:
        v = array("f")
        v.frombytes(blob)
        if len(v) != len(q):
            continue  # another function's: dropped and embedded again at the next refresh
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        score = sum(a * b for a, b in zip(q, v, strict=True)) / (q_norm * norm)
        if score > 0:  # nothing in common is no match
            scored.append((-score, i, Passage(id=i, source=s, location=loc, text=t)))
    scored.sort(key=lambda found: found[:2])
    return [p for _, _, p in scored[:limit]]


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
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS vectors (hash TEXT PRIMARY KEY, vector BLOB NOT NULL)"
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

    def unembedded(self, limit: int, dimensions: int) -> dict[str, str]:
        with self._lock:
            self._db.execute("DELETE FROM vectors WHERE length(vector) != ?", (dimensions * 4,))
            texts = {text_hash(t): t for (t,) in self._db.execute("SELECT text FROM chunks")}
            stored = {h for (h,) in self._db.execute("SELECT hash FROM vectors")}
        gone = stored - set(texts)
        if gone:
            with self._lock, transaction(self._db):
                self._db.executemany("DELETE FROM vectors WHERE hash = ?", [(h,) for h in gone])
        missing = [h for h in texts if h not in stored]
        return {h: texts[h] for h in missing[:limit]}

    def add_vectors(self, vectors: dict[str, Sequence[float]]) -> None:
        with self._lock, transaction(self._db):
            self._db.executemany(
                "INSERT OR IGNORE INTO vectors (hash, vector) VALUES (?, ?)",
                [(h, pack(v)) for h, v in vectors.items()],
            )

    def nearest(self, vector: Sequence[float], limit: int) -> list[Passage]:
        with self._lock:
            by_hash = dict(self._db.execute("SELECT hash, vector FROM vectors").fetchall())
            chunks = self._db.execute("SELECT id, source, location, text FROM chunks").fetchall()
        rows = [(*c, by_hash[h]) for c in chunks if (h := text_hash(c[3])) in by_hash]
        return nearest(vector, rows, limit)

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
