"""`Knowledge`: an agent's documents, indexed and searched (a `ContextSource`)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Union, cast

from pydantic import BaseModel, Field

from durable_agent.attachments import Attachment
from durable_agent.context_sources import (
    MAX_PASSAGES,
    SEARCH_TOOL,
    Passage,
    in_turn,
    render_passages,
)
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
from durable_agent.knowledge._store import KnowledgeStore, SQLiteStore, VectorStore
from durable_agent.principal import Principal
from durable_agent.runtime import attachments as stored_attachments
from durable_agent.settings import state_dir
from durable_agent.tools import Tool, ToolContext, tool

log = logging.getLogger("durable_agent.knowledge")

MAX_FILES = 1_000
"""Source files of one `Knowledge` at most, by default (paths and globs expanded)."""
MAX_FILES_LIMIT = 100_000

Source = Union[str, Path, Document]  # noqa: UP007 - a runtime alias on 3.10
Embed = Callable[[list[str]], Sequence[Sequence[float]]]
"""An embedding function: texts in, one vector (floats, all of one length) per text out."""
EMBED_BATCH = 64
"""Chunks given to the embedding function at once."""
MAX_DIMENSIONS = 8_192
RRF_K = 60
"""Reciprocal rank fusion's constant (a passage scores 1/(60 + its rank) in each list)."""


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
        embed: Embed | None = None,
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
        if embed is not None and not callable(embed):
            raise ValueError(f"knowledge {name!r}: embed is a function of texts, not {embed!r}")
        self.embed = embed
        self._embed_failed = False
        """The hook failed on the index as it is: tried again once the index changes."""
        self._dimensions: int | None = None
        """The length of the hook's vectors, as first seen (asked of it as indexing
        starts)."""
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
        refresh of what changed: by their words (BM25), and with `embed`, by their
        vectors' nearness to the query's too, the two rankings fused (RRF)."""
        self.refresh()
        limit = min(limit or self.top_k, MAX_PASSAGES)
        by_words = self.store.search(query, limit * 2)
        if self.embed is None or self._embed_failed:
            return by_words[:limit]  # a hook that failed was said in the log, once
        vector = self._embedded_query(self.embed, query)
        if vector is None:
            return by_words[:limit]
        by_meaning = self._vectors().nearest(vector, limit * 2)
        return fused([by_words, by_meaning])[:limit]

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
            removed = set(stored) - declared
            for gone in removed:
                store.remove(gone)
                self._seen.pop(gone, None)
            if self.embed is not None and (changed or removed or not self._embed_failed):
                self._embed_chunks(self.embed)
            return changed

    def _vectors(self) -> VectorStore:
        store = self.store
        if not all(hasattr(store, m) for m in ("unembedded", "add_vectors", "nearest")):
            raise KnowledgeError(
                f"knowledge {self.name!r}: its store keeps no vectors (`VectorStore`: "
                "unembedded, add_vectors, nearest); give SQLiteStore or PostgresStore, or no embed"
            )
        return cast(VectorStore, store)

    def _embed_chunks(self, embed: Embed) -> None:
        """Vectors for the chunks that have none (new or edited texts), in batches. A hook
        that fails is one line in the log: the index is searched by words alone until
        it changes (then the hook is tried again)."""
        try:
            store = self._vectors()
            # The function's length, before any vector is kept: vectors another function
            # left (of another length) are dropped and embedded again.
            dimensions = self._dimensions or len(self._embedded(embed, [self.name])[0])
            while missing := store.unembedded(EMBED_BATCH, dimensions):
                vectors = self._embedded(embed, list(missing.values()))
                store.add_vectors(dict(zip(missing, vectors, strict=True)))
            self._embed_failed = False
        except KnowledgeError as e:
            self._embed_failed = True
            log.warning("%s (searching by words only)", e)

    def _embedded(self, embed: Embed, texts: list[str]) -> list[list[float]]:
        """The hook's vectors for `texts`, checked: one per text, floats, all of one
        length (the one the index holds already); a `KnowledgeError` line otherwise."""
        where = f"knowledge {self.name!r}: the embedding function"
        try:
            given = embed(texts)
            vectors = [[float(x) for x in v] for v in given]
        except Exception as e:  # the hook is the application's: any failure is one line
            first = str(e).splitlines()[0][:200] if str(e) else ""
            raise KnowledgeError(f"{where} failed ({type(e).__name__}: {first})") from None
        sizes = {len(v) for v in vectors}
        if len(vectors) != len(texts) or len(sizes) != 1:
            raise KnowledgeError(
                f"{where} gave {len(vectors)} vector(s) of {sorted(sizes)} dimensions for "
                f"{len(texts)} text(s); it must give one vector per text, all of one length"
            )
        (size,) = sizes
        if not 1 <= size <= MAX_DIMENSIONS:
            raise KnowledgeError(
                f"{where} gave vectors of {size} dimensions; give 1 to {MAX_DIMENSIONS:,}"
            )
        if self._dimensions not in (None, size):
            raise KnowledgeError(
                f"{where} gave vectors of {size} dimensions, and of {self._dimensions} before: "
                "one function, one length, for the whole index"
            )
        if not all(math.isfinite(x) for v in vectors for x in v):
            raise KnowledgeError(f"{where} gave a vector with NaN or infinity")
        self._dimensions = size
        return vectors

    def _embedded_query(self, embed: Embed, query: str) -> list[float] | None:
        """The query's vector, or None (one line in the log) if the hook fails on it."""
        try:
            (vector,) = self._embedded(embed, [query])
        except KnowledgeError as e:
            log.warning("%s (searching by words only)", e)
            return None
        return vector

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


def fused(rankings: Sequence[Sequence[Passage]]) -> list[Passage]:
    """Rankings of passages fused into one by reciprocal rank: each passage scores
    1/(RRF_K + its rank) in each list it is in, summed; ties keep the first list's order."""
    scores: dict[str, float] = {}
    found: dict[str, Passage] = {}
    for ranking in rankings:
        for rank, passage in enumerate(ranking, 1):
            scores[passage.id] = scores.get(passage.id, 0.0) + 1 / (RRF_K + rank)
            found.setdefault(passage.id, passage)
    order = sorted(found, key=lambda pid: -scores[pid])
    return [found[pid] for pid in order]


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
        if ctx.documents:
            # The turn's files, read as the turn's (owner and lineage checked by the store).
            loaded = await stored_attachments.load(ctx.documents)
            documents = [(a, loaded[a.sha256]) for a in ctx.documents]
            attached = await knowledge.attached_passages(documents, args.query, knowledge.top_k)
            passages = in_turn(attached, passages)[: knowledge.top_k]
        return render_passages(passages, f"Knowledge search for {args.query!r}")

    search_knowledge.__doc__ = (
        "Search the team's documents (knowledge) for passages about a topic: each comes "
        "with its id and source. Answer from them and cite the ids you use, e.g. "
        "[kb_0123456789abcdef]."
    )
    made: Tool = tool(search_knowledge, name=SEARCH_TOOL, quick=True)
    return made
