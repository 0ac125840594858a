"""`Knowledge`: an agent's documents, indexed and searched (a `ContextSource`)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel, Field

from durable_agent.attachments import Attachment
from durable_agent.context_sources import MAX_PASSAGES, SEARCH_TOOL, Passage, render_passages
from durable_agent.errors import KnowledgeError
from durable_agent.knowledge._attached import attached_passages
from durable_agent.knowledge._chunk import (
    CHUNK_CHARS,
    KINDS,
    MAX_CHUNK_CHARS,
    MIN_CHUNK_CHARS,
    Document,
    chunk_sections,
    kind_of,
    read_source,
    sections,
)
from durable_agent.knowledge._store import KnowledgeStore, SQLiteStore
from durable_agent.principal import Principal
from durable_agent.settings import state_dir
from durable_agent.tools import Tool, ToolContext, tool

log = logging.getLogger("durable_agent.knowledge")

MAX_FILES = 1_000
"""Source files of one `Knowledge` at most, by default (paths and globs expanded)."""
MAX_FILES_LIMIT = 100_000

Source = Union[str, Path, Document]  # noqa: UP007 - a runtime alias on 3.10


class KnowledgeQuery(BaseModel):
    query: str = Field(min_length=1, max_length=500, description="What to look for, in a few words")


class Knowledge:
    """Documents an agent answers from: files (paths, folders, globs) and documents given
    in memory, cut into chunks and indexed in the state folder.

        Knowledge(["docs/", "handbook/**/*.pdf", Document("faq", "...")], retrieve=3)

    Its agent gets `search_knowledge(query)`; with `retrieve=N`, each turn also starts
    with the question's top N chunks in the model's conversation (the retrieval step).
    The index is built as a worker that serves the agent starts, and refreshed before
    every search and retrieval: a file whose size or time changed is read again, and
    re-indexed if its content hash differs. `name` names the index file
    (`<state folder>/knowledge/<name>.sqlite3`): give each `Knowledge` of one state
    folder a name of its own."""

    def __init__(
        self,
        sources: Sequence[Source] = (),
        *,
        name: str = "knowledge",
        retrieve: int = 0,
        top_k: int = 5,
        chunk_chars: int = CHUNK_CHARS,
        max_files: int = MAX_FILES,
        store: Callable[[], KnowledgeStore] | None = None,
    ) -> None:
        if isinstance(sources, (str, Path, Document)):
            sources = [sources]
        bad = [s for s in sources if not isinstance(s, (str, Path, Document))]
        if bad:
            raise ValueError(f"knowledge {name!r}: {bad[0]!r} is not a path, a glob or a Document")
        if not 0 <= retrieve <= MAX_PASSAGES or not 1 <= top_k <= MAX_PASSAGES:
            raise ValueError(
                f"knowledge {name!r}: retrieve must be from 0 to {MAX_PASSAGES} and top_k "
                f"from 1 to {MAX_PASSAGES}"
            )
        if not MIN_CHUNK_CHARS <= chunk_chars <= MAX_CHUNK_CHARS or not (
            1 <= max_files <= MAX_FILES_LIMIT
        ):
            raise ValueError(
                f"knowledge {name!r}: chunk_chars must be from {MIN_CHUNK_CHARS} to "
                f"{MAX_CHUNK_CHARS:,} and "
                f"max_files from 1 to {MAX_FILES_LIMIT:,}"
            )
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"knowledge name {name!r}: use letters, digits, '-' and '_'")
        self.name = name
        self.retrieve = retrieve
        self.top_k = top_k
        self.chunk_chars = chunk_chars
        self.max_files = max_files
        self.paths = [str(s) for s in sources if not isinstance(s, Document)]
        self.documents = [s for s in sources if isinstance(s, Document)]
        self._make_store = store
        self._store: KnowledgeStore | None = None
        self._seen: dict[str, tuple[int, int]] = {}
        """Each file's (size, mtime) when it was last read: unchanged ones are not read."""
        self._syncing = threading.Lock()
        self._tool = _search_tool(self)

    # -- the ContextSource protocol --------------------------------------------------

    def tools(self) -> Sequence[Tool]:
        return [self._tool]

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Knowledge]:
        """Indexed as the worker starts; the index closed when it stops."""
        await asyncio.to_thread(self.refresh)
        try:
            yield self
        finally:
            store, self._store = self._store, None
            if store is not None:
                store.close()

    async def passages(
        self, question: str, limit: int, asker: Principal | None = None
    ) -> list[Passage]:
        # The same documents for everyone: `asker` is not needed.
        return await asyncio.to_thread(self.search, question, limit)

    async def attached_passages(
        self, documents: Sequence[tuple[Attachment, bytes]], question: str, limit: int
    ) -> list[Passage]:
        """The turn's attached documents' chunks that best match the question (the
        retrieval step's, `context_sources.ReadsAttached`): searched for that turn only."""
        return await asyncio.to_thread(
            attached_passages, documents, question, limit, self.chunk_chars
        )

    # -- plain Python: indexing and searching ----------------------------------------

    @property
    def store(self) -> KnowledgeStore:
        if self._store is None:
            if self._make_store is not None:
                self._store = self._make_store()
            else:
                self._store = SQLiteStore(state_dir() / "knowledge" / f"{self.name}.sqlite3")
        return self._store

    def search(self, query: str, limit: int = 0) -> list[Passage]:
        """The chunks best matching `query` (at most `limit`, default `top_k`), after a
        refresh of what changed."""
        self.refresh()
        return self.store.search(query, min(limit or self.top_k, MAX_PASSAGES))

    def refresh(self) -> int:
        """Indexes what changed since the last look (new, edited or removed sources);
        how many sources were indexed again. A source that cannot be read is logged in
        one line and left out (its earlier chunks too)."""
        with self._syncing:
            store = self.store
            stored = store.digests()
            declared: set[str] = set()
            changed = 0
            try:
                files = self.files()
            except KnowledgeError as e:  # too many files: the index stays as it was
                log.warning("%s (the index is left as it was)", e)
                return 0
            for source, path in files:
                declared.add(source)
                changed += self._sync_file(store, stored, source, path)
            for doc in self.documents:
                declared.add(doc.source)
                digest = self._digest(doc.text.encode(), doc.kind)
                if stored.get(doc.source) != digest:
                    parts = sections(doc.text.encode(), doc.kind, doc.source)
                    chunks = chunk_sections(doc.source, parts, self.chunk_chars)
                    changed += store.replace(doc.source, digest, chunks)
            for gone in set(stored) - declared:
                store.remove(gone)
                self._seen.pop(gone, None)
            return changed

    def _sync_file(
        self, store: KnowledgeStore, stored: dict[str, str], source: str, path: Path
    ) -> int:
        try:
            st = path.stat()
        except OSError:
            return 0  # gone since it was listed: the next refresh removes it
        signature = (st.st_size, st.st_mtime_ns)
        if self._seen.get(source) == signature:
            return 0  # unchanged since it was read (or found unreadable)
        self._seen[source] = signature
        try:
            kind = kind_of(path)
            data = read_source(path, source)
            digest = self._digest(data, kind)
            if stored.get(source) == digest:
                return 0
            chunks = chunk_sections(source, sections(data, kind, source), self.chunk_chars)
        except KnowledgeError as e:
            log.warning("knowledge %s: %s (left out)", self.name, e)
            store.remove(source)
            return 0
        return int(store.replace(source, digest, chunks))

    def _digest(self, data: bytes, kind: str) -> str:
        # The chunk size is part of what was indexed: another size indexes again.
        given = f"{kind}|{self.chunk_chars}|".encode() + data
        return hashlib.sha256(given).hexdigest()

    def files(self) -> list[tuple[str, Path]]:
        """The declared files, as (source name, path): folders' readable files and
        globs' matches, in order, once each; a `KnowledgeError` past `max_files`."""
        found: dict[str, Path] = {}
        for given in self.paths:
            matches = [Path(m) for m in sorted(glob.glob(given, recursive=True))]
            if not matches:
                log.warning("knowledge %s: %r matches no file", self.name, given)
            for match in matches:
                for path in _files_in(match):
                    found.setdefault(_source_name(path), path)
                    if len(found) > self.max_files:
                        raise KnowledgeError(
                            f"knowledge {self.name!r}: over {self.max_files:,} files; give "
                            "narrower paths, or a larger max_files"
                        )
        return list(found.items())

    def __repr__(self) -> str:
        return f"Knowledge({self.paths + [d.source for d in self.documents]!r}, name={self.name!r})"


def _files_in(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in KINDS)
    return [path] if path.is_file() else []


def _source_name(path: Path) -> str:
    """What citations show: the path from the current folder when it is under it."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(Path(os.getcwd()).resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def _search_tool(knowledge: Knowledge) -> Tool:
    async def search_knowledge(args: KnowledgeQuery, ctx: ToolContext[Any]) -> str:
        passages = await knowledge.passages(args.query, knowledge.top_k)
        return render_passages(passages, f"Knowledge search for {args.query!r}")

    search_knowledge.__doc__ = (
        "Search the team's documents (knowledge) for passages about a topic: each comes "
        "with its id and source. Answer from them and cite the ids you use, e.g. "
        "[kb_0123456789abcdef]."
    )
    made: Tool = tool(search_knowledge, name=SEARCH_TOOL, quick=True)
    return made
