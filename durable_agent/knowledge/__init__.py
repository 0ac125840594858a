"""Knowledge: an agent answers from its team's documents, with citations.

    from durable_agent import Agent
    from durable_agent.knowledge import Document, Knowledge

    agent = Agent(name="helpdesk", knowledge=Knowledge(["docs/", "*.pdf"], retrieve=3))

Text, Markdown (by headings), HTML (its text) and PDF (its text layer: the `documents`
extra) are cut into chunks, each with a stable id and its place in its source, and
indexed in SQLite's full-text index under the state folder (`KnowledgeStore`,
`SQLiteStore`), or in PostgreSQL's (`PostgresStore`, the `postgres` extra), with a
vector beside each chunk when an embedding function is given (`embed=`). A turn's
attached documents are searched with them by the retrieval step (`attached_passages`).
See docs/knowledge-and-memory.md.
"""

from durable_agent.errors import KnowledgeError
from durable_agent.knowledge._attached import attached_passages
from durable_agent.knowledge._chunk import (
    CHUNK_CHARS,
    MAX_FILE_BYTES,
    Chunk,
    Document,
    chunk_document,
    chunk_id,
)
from durable_agent.knowledge._knowledge import MAX_FILES, SEARCH_TOOL, Embed, Knowledge, fused
from durable_agent.knowledge._postgres import PostgresStore
from durable_agent.knowledge._store import KnowledgeStore, SQLiteStore, VectorStore, fts_query

__all__ = [
    "CHUNK_CHARS",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "SEARCH_TOOL",
    "Chunk",
    "Document",
    "Embed",
    "Knowledge",
    "KnowledgeError",
    "KnowledgeStore",
    "PostgresStore",
    "SQLiteStore",
    "VectorStore",
    "attached_passages",
    "chunk_document",
    "chunk_id",
    "fts_query",
    "fused",
]
