"""Documents into chunks: text, Markdown (by headings), HTML (its text, by headings) and
PDF (its text layer, by page). Each chunk has a stable id and its place in its source.

    chunks = chunk_document(Document(source="guide.md", text="# Install\n..."))

Plain functions, no I/O but reading the file a path names (`read_source`): the store
and the worker call them, and the tests call them directly.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from durable_agent.attachments import pdf_pages
from durable_agent.errors import KnowledgeError

CHUNK_CHARS = 1_200
"""A chunk's text at most, by default: a few paragraphs, so a search hit is specific."""
MIN_CHUNK_CHARS = 200
MAX_CHUNK_CHARS = 8_000
MAX_FILE_BYTES = 10 * 1024 * 1024
"""A source file at most (10 MiB): larger ones are skipped, saying so."""
MAX_CHUNKS_PER_SOURCE = 5_000

KINDS = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".text": "text",
    ".rst": "text",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}
"""The kinds of source read, by file suffix; a document given in memory names its own."""


@dataclass(frozen=True)
class Document:
    """A document given in memory (`Knowledge(documents=[...])`): its name (what
    citations show), its text, and its kind (`text`, `markdown`, `html`)."""

    source: str
    text: str
    kind: str = "text"


@dataclass(frozen=True)
class Chunk:
    id: str
    source: str
    position: int
    """Its place among its source's chunks, from 0."""
    location: str
    """A heading's path (`Install › Linux`) or a page (`page 2`); empty for plain text."""
    text: str


@dataclass(frozen=True)
class _Section:
    location: str
    text: str


def chunk_id(source: str, position: int, text: str) -> str:
    """`kb_` and 16 hex digits of a hash of the source, the chunk's position and its
    content: the same chunk of the same source has the same id on every worker, and an
    edit gives the chunks it changed new ids. Each part is length-prefixed, so no two
    (source, position, text) triples hash the same input."""
    content = hashlib.sha256(text.encode()).hexdigest()
    given = f"{len(source)}:{source}|{position}|{content}"
    return "kb_" + hashlib.sha256(given.encode()).hexdigest()[:16]


def kind_of(path: Path) -> str:
    kind = KINDS.get(path.suffix.lower())
    if kind is None:
        known = ", ".join(sorted(KINDS))
        raise KnowledgeError(
            f"{path}: cannot read {path.suffix or 'files without a suffix'} "
            f"files; give files ending in {known}"
        )
    return kind


def read_source(path: Path, source: str) -> bytes:
    """The file's bytes: one `KnowledgeError` line if it is too large or unreadable."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise KnowledgeError(
                f"{source}: {size:,} bytes, over the {MAX_FILE_BYTES:,} a source may have; "
                "split it, or leave it out of the knowledge"
            )
        return path.read_bytes()
    except OSError as e:
        raise KnowledgeError(f"{source}: cannot be read ({e.strerror or e})") from None


def sections(data: bytes, kind: str, source: str, max_chars: int | None = None) -> list[_Section]:
    """The source's sections; a PDF's pages read until `max_chars` (None: all)."""
    if kind == "pdf":
        return _pdf_sections(data, source, max_chars)
    text = data.decode("utf-8", errors="replace")
    if kind == "markdown":
        return _markdown_sections(text)
    if kind == "html":
        return _html_sections(text)
    return [_Section("", text)]


def chunk_sections(source: str, parts: list[_Section], size: int = CHUNK_CHARS) -> list[Chunk]:
    """Each section cut into chunks of at most `size` characters, at paragraph breaks
    where it can (a paragraph longer than that is cut at words)."""
    if not MIN_CHUNK_CHARS <= size <= MAX_CHUNK_CHARS:
        raise ValueError(
            f"a chunk size must be from {MIN_CHUNK_CHARS} to {MAX_CHUNK_CHARS:,}, not {size:,}"
        )
    chunks: list[Chunk] = []
    for part in parts:
        for text in _pieces(part.text, size):
            position = len(chunks)
            if position >= MAX_CHUNKS_PER_SOURCE:
                raise KnowledgeError(
                    f"{source}: over {MAX_CHUNKS_PER_SOURCE:,} chunks; split it into "
                    "several files, or give a larger chunk size"
                )
            chunks.append(
                Chunk(chunk_id(source, position, text), source, position, part.location, text)
            )
    return chunks


def chunk_document(doc: Document, size: int = CHUNK_CHARS) -> list[Chunk]:
    return chunk_sections(doc.source, sections(doc.text.encode(), doc.kind, doc.source), size)


def _pieces(text: str, size: int) -> list[str]:
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    pieces: list[str] = []
    current = ""
    for paragraph in filter(None, paragraphs):
        while len(paragraph) > size:  # cut at the last space within the size
            cut = paragraph.rfind(" ", 0, size)
            cut = cut if cut > size // 2 else size
            if current:
                pieces.append(current)
                current = ""
            pieces.append(paragraph[:cut].strip())
            paragraph = paragraph[cut:].strip()
        if current and len(current) + 1 + len(paragraph) > size:
            pieces.append(current)
            current = ""
        current = f"{current}\n{paragraph}" if current else paragraph
    if current:
        pieces.append(current)
    return pieces


_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _markdown_sections(text: str) -> list[_Section]:
    """One section per heading, located by the path of headings above it."""
    path: list[tuple[int, str]] = []
    found: list[_Section] = []
    lines: list[str] = []
    fenced = False

    def close() -> None:
        if any(line.strip() for line in lines):
            found.append(_Section(" › ".join(t for _, t in path), "\n".join(lines)))
        lines.clear()

    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        heading = None if fenced else _HEADING.match(line)
        if heading is None:
            lines.append(line)
            continue
        close()
        level = len(heading.group(1))
        path = [(lv, t) for lv, t in path if lv < level] + [(level, heading.group(2))]
        lines.append(heading.group(2))  # a heading's words find its section
    close()
    return found


class _HTMLText(HTMLParser):
    """An HTML page's text (not its scripts or styles), in sections by heading."""

    SKIP = {"script", "style", "template", "noscript", "head"}
    BLOCKS = {"p", "div", "li", "tr", "br", "section", "article", "pre", "table", "ul", "ol"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.skipping = 0
        self.heading = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self.heading = True
            self.out.append(f"\n\n{'#' * int(tag[1])} ")
        elif tag in self.BLOCKS:
            self.out.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif re.fullmatch(r"h[1-6]", tag):
            self.heading = False
            self.out.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            # Inside a heading its text stays on the heading's line.
            self.out.append(data.replace("\n", " ") if self.heading else data)


def _html_sections(text: str) -> list[_Section]:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    # Headings become Markdown's, so they locate their sections the same way.
    return _markdown_sections("".join(parser.out))


def _pdf_sections(data: bytes, source: str, max_chars: int | None = None) -> list[_Section]:
    try:
        pages = pdf_pages(data, max_chars)
    except ImportError:
        raise KnowledgeError(
            f"{source}: reading PDF needs pypdf: pip install 'durable-agent[documents]'"
        ) from None
    except ValueError as e:
        raise KnowledgeError(f"{source}: not a readable PDF ({e})") from None
    return [_Section(f"page {n}", text) for n, text in enumerate(pages, 1) if text.strip()]
