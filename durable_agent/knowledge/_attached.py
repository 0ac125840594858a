"""A turn's attached documents as knowledge for that turn (seed 004's "new documents are
inserted into the memory bank first").

    passages = attached_passages([(attachment, data), ...], "refund within how long?", 3)

Where they live, and why: nowhere shared. The retrieval activity reads the turn's
document attachments from the payload store (their owner and lineage checked there, as
for the model), and this module cuts them with knowledge's chunker and searches them in
an index made for that one search (SQLite FTS5 in memory, BM25). So a file is
searchable by the turns that may read it (the turn it came with, its conversation's
later turns, forks by lineage) and by no other turn or customer: no index outside the
payload store holds it, and nothing in a history but the passages the step returns.
Cutting a file is the costly part, so its chunks are kept in a small cache of the
worker, by the file's sha256 (the same bytes cut the same way on every worker).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from durable_agent.attachments import MAX_TEXT_CHARS, PDF, Attachment
from durable_agent.context_sources import MAX_PASSAGES, Passage
from durable_agent.errors import KnowledgeError
from durable_agent.knowledge._chunk import CHUNK_CHARS, KINDS, Chunk, chunk_sections
from durable_agent.knowledge._chunk import sections as text_sections
from durable_agent.knowledge._store import fts_query

log = logging.getLogger("durable_agent.knowledge")

ATTACHED_PREFIX = "file_"
"""An attached document's passage ids: `file_` and 16 hex digits."""
CACHE_CHARS = 8 * MAX_TEXT_CHARS
"""The worker's cache of cut files holds at most this much text (a few long PDFs)."""

_cache: OrderedDict[tuple[str, int], list[Chunk]] = OrderedDict()
_cached_chars = 0
_caching = threading.Lock()


def attached_chunks(attachment: Attachment, data: bytes, size: int = CHUNK_CHARS) -> list[Chunk]:
    """A document attachment's chunks (none for an image), its first `MAX_TEXT_CHARS`
    characters read: Markdown and HTML by headings (by the name's suffix: the type
    sniffed is text), PDF by page. Their source is the file's name, their ids its hash's."""
    key = (attachment.sha256, size)
    with _caching:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    chunks = _cut(attachment, data, size)
    _keep(key, chunks)
    return chunks


def attached_passages(
    documents: Sequence[tuple[Attachment, bytes]],
    question: str,
    limit: int,
    size: int = CHUNK_CHARS,
) -> list[Passage]:
    """The chunks of these documents that best match the question (BM25), at most
    `limit`; a file that cannot be read is left out with one line in the log (the
    model's own reading of it says why)."""
    chunks: list[Chunk] = []
    for attachment, data in documents:
        try:
            chunks += attached_chunks(attachment, data, size)
        except KnowledgeError as e:
            log.warning("attached %s (not searched)", e)
    match = fts_query(question)
    if not chunks or not match or limit < 1:
        return []
    db = sqlite3.connect(":memory:")
    try:
        db.execute(
            "CREATE VIRTUAL TABLE chunks USING fts5(id UNINDEXED, source UNINDEXED, "
            "location, text, tokenize = 'porter unicode61')"
        )
        db.executemany(
            "INSERT INTO chunks (id, source, location, text) VALUES (?, ?, ?, ?)",
            [(c.id, c.source, c.location, c.text) for c in chunks],
        )
        rows = db.execute(
            "SELECT id, source, location, text FROM chunks WHERE chunks MATCH ? "
            "ORDER BY bm25(chunks, 0, 0, 2.0, 1.0) LIMIT ?",
            (match, min(limit, MAX_PASSAGES)),
        ).fetchall()
    finally:
        db.close()
    return [Passage(id=i, source=s, location=loc, text=t) for i, s, loc, t in rows]


def _cut(attachment: Attachment, data: bytes, size: int) -> list[Chunk]:
    if attachment.is_image:
        return []  # the model sees it; a search cannot
    name = attachment.name
    if attachment.content_type == PDF:
        parts = text_sections(data, "pdf", name, MAX_TEXT_CHARS)
    else:
        # The sniffed type is text: its name's suffix says whether Markdown or HTML.
        kind = KINDS.get(Path(name).suffix.lower(), "text")
        text = data.decode("utf-8", errors="replace")[:MAX_TEXT_CHARS]
        parts = text_sections(text.encode(), "text" if kind == "pdf" else kind, name)
    # Ids of the file's bytes, not its name: the same file cited the same in every turn.
    return [
        replace(c, id=_attached_id(attachment.sha256, c.position, c.text))
        for c in chunk_sections(name, parts, size)
    ]


def _attached_id(digest: str, position: int, text: str) -> str:
    given = f"{digest}|{position}|{hashlib.sha256(text.encode()).hexdigest()}"
    return ATTACHED_PREFIX + hashlib.sha256(given.encode()).hexdigest()[:16]


def _keep(key: tuple[str, int], chunks: list[Chunk]) -> None:
    global _cached_chars
    chars = sum(len(c.text) for c in chunks)
    with _caching:
        if key in _cache or chars > CACHE_CHARS:
            return
        _cache[key] = chunks
        _cached_chars += chars
        while _cached_chars > CACHE_CHARS:
            _, dropped = _cache.popitem(last=False)
            _cached_chars -= sum(len(c.text) for c in dropped)
