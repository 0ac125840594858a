"""Files and images in a question: what an attachment is, and what one may be.

An attachment travels as a reference. Its bytes are written once, by whoever asks,
into the payload store (`durable_agent/runtime/storage.py`) as a payload of the turn
that reads them; the turn's input, its history and every activity input carry only
the `Attachment` below (a name, a type, a size, a hash and the stored payload's
reference, a few hundred bytes). The model activity reads the bytes back from the
store, checked against their hash, and hands them to the backend, which sends them
the way its API takes them (`parts`).

Nothing about a file is trusted. Its type is sniffed from its bytes (PNG, JPEG, GIF,
WebP and PDF by their magic numbers; text if it is UTF-8 with no control characters),
never taken from its name, and a file whose name says another type than its bytes is
refused (`AttachmentRefused`, one line): a `.pdf` that is an executable, or a `.png`
that is a script, never reaches a model. Sizes, counts and types are bounded per agent
(`AttachmentLimits`, `Agent(attachments=...)`), within the hard bounds here.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, Field, field_validator

from durable_agent.errors import AttachmentRefused, AttachmentUnreadable

ContentType = Literal[
    "image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf", "text/plain"
]
PNG: Final = "image/png"
JPEG: Final = "image/jpeg"
GIF: Final = "image/gif"
WEBP: Final = "image/webp"
PDF: Final = "application/pdf"
TEXT: Final = "text/plain"
IMAGES = (PNG, JPEG, GIF, WEBP)
TYPES = (*IMAGES, PDF, TEXT)
"""Every type an attachment may be: what the providers' APIs take natively."""

_NAMED = {
    ".png": PNG,
    ".jpg": JPEG,
    ".jpeg": JPEG,
    ".gif": GIF,
    ".webp": WEBP,
    ".pdf": PDF,
    **dict.fromkeys(
        (".txt", ".md", ".markdown", ".csv", ".tsv", ".json", ".html", ".htm", ".xml")
        + (".yaml", ".yml", ".log", ".rst", ".ini", ".toml"),
        TEXT,
    ),
}
"""The type a file's name says, by its suffix (a name without one says nothing)."""
_SHOWN = {PNG: "PNG image", JPEG: "JPEG image", GIF: "GIF image", WEBP: "WebP image"}
_SHOWN |= {PDF: "PDF document", TEXT: "text file"}

MAX_BYTES = 32 * 1024 * 1024
"""The most one attachment may be, whatever an agent allows: within what providers take
(Bedrock: 3.75 MB an image, 4.5 MB a document; Anthropic: 32 MB a request)."""
MAX_COUNT = 20
"""The most attachments one question may carry, whatever an agent allows."""
MAX_NAME_CHARS = 200
MAX_REF_CHARS = 8192
"""A reference to a stored payload is a few hundred characters; a small file kept inline
(the store off, `runtime.attachments.MAX_INLINE`) a few thousand."""
SNIFF_TEXT_BYTES = 64 * 1024
"""How much of a file is read to tell text from binary (all of it must be UTF-8)."""
MAX_TEXT_CHARS = 200_000
"""The most text a document gives the offline model and the shields: a long PDF is read
this far."""


class AttachmentLimits(BaseModel):
    """What an agent takes in a question (`Agent(attachments=...)`): at most `max_count`
    files of at most `max_bytes` each, of these `types` (among `TYPES`)."""

    max_bytes: int = Field(default=10 * 1024 * 1024, ge=1, le=MAX_BYTES)
    max_count: int = Field(default=5, ge=0, le=MAX_COUNT)
    types: tuple[str, ...] = TYPES

    @field_validator("types")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [t for t in v if t not in TYPES]
        if unknown:
            raise ValueError(f"unknown attachment types {unknown}; known: {', '.join(TYPES)}")
        return v

    def check(self, attachments: Sequence[Attachment]) -> None:
        """`AttachmentRefused` for the first attachment these limits do not allow."""
        self.check_count(len(attachments))
        for a in attachments:
            self.check_one(a.name, a.content_type, a.size)

    def check_count(self, count: int) -> None:
        if count > self.max_count:
            raise AttachmentRefused(
                f"{count} attachments; this agent takes at most {self.max_count}"
            )

    def check_one(self, name: str, content_type: str, size: int) -> None:
        if content_type not in self.types:
            allowed = ", ".join(_SHOWN[t] for t in self.types) or "none"
            raise AttachmentRefused(
                f"{name!r} is {_a(content_type)}, which this agent does not take "
                f"(it takes: {allowed})"
            )
        if size > self.max_bytes:
            raise self.too_large(name, size)

    def too_large(self, name: str, size: int) -> AttachmentRefused:
        return AttachmentRefused(
            f"{name!r} is too large ({size:,} bytes; this agent takes at most "
            f"{self.max_bytes:,}): send a smaller file or an excerpt"
        )


class Attachment(BaseModel):
    """A file of a question, by reference: what travels with the turn."""

    # Bounded and checked as it arrives: a caller may build one by hand.
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    """Its file name, without folders."""
    content_type: ContentType
    """As sniffed from its bytes (`sniff`), one of `TYPES`."""
    size: int = Field(ge=0, le=MAX_BYTES)
    """Bytes."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Of its bytes: a turn's request is the same request only with the same files."""
    ref: str = Field(max_length=MAX_REF_CHARS)
    """The stored payload that holds its bytes (base64 of the payload, which the
    payload store has made a reference of), read back by the model activity."""
    owner: str = Field(default="", max_length=1000)
    """The workflow whose payload that is, when not the turn's own: its conversation's
    (a message's files are stored before its turn exists)."""

    @property
    def is_image(self) -> bool:
        return self.content_type in IMAGES

    def line(self) -> str:
        """How `show` names it."""
        return (
            f"{self.name} ({_SHOWN.get(self.content_type, self.content_type)}, {_size(self.size)})"
        )


Source = bytes | str | os.PathLike[str] | tuple[str, bytes]
"""What `AgentClient.ask(attachments=...)` takes: bytes, a path, or (name, bytes)."""


class File(BaseModel):
    """A file read and checked, before it is stored: its bytes and what they are."""

    name: str
    content_type: ContentType
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def read(source: Source, limits: AttachmentLimits) -> File:
    """A file from what a caller gave, sniffed and checked against its name and `limits`:
    `AttachmentRefused`, in one line, otherwise."""
    if isinstance(source, bytes):
        name, data = "", source
    elif isinstance(source, tuple):
        name, data = str(source[0]), source[1]
    else:
        path = Path(source)
        name = path.name
        try:
            size = path.stat().st_size
            if size > limits.max_bytes:  # refused before it is read whole
                raise limits.too_large(name, size)
            data = path.read_bytes()
        except OSError as e:
            raise AttachmentRefused(f"cannot read {str(path)!r}: {e.strerror}") from None
    if not isinstance(data, bytes):
        raise AttachmentRefused(
            f"an attachment is bytes, a path or (name, bytes), not {type(data).__name__}"
        )
    found = sniff(data)
    name = _clean_name(name, found)
    if found is None:
        raise AttachmentRefused(
            f"{name!r} is no file type attachments take (PNG, JPEG, GIF, WebP, PDF or UTF-8 text)"
        )
    said = _named_type(name)
    if said is not None and said != found or said is None and "." in name.strip("."):
        named = f"{_a(said)}, as its name says" if said else f"a {Path(name).suffix} file"
        raise AttachmentRefused(
            f"{name!r} is {_a(found)} by its content, not {named}: refused; "
            "send the file it names, or name it for what it is"
        )
    limits.check_one(name, found, len(data))
    return File(name=name, content_type=found, data=data)


def sniff(data: bytes) -> ContentType | None:
    """The file's type by its bytes (one of `TYPES`), or None: none of them."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if data.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return WEBP
    if data.startswith(b"%PDF-"):
        return PDF
    return TEXT if _is_text(data) else None


def _is_text(data: bytes) -> bool:
    head = data[:SNIFF_TEXT_BYTES]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        # A multi-byte character cut at the end of the head is still text.
        if e.start < len(head) - 3 or len(data) <= SNIFF_TEXT_BYTES:
            return False
        text = head[: e.start].decode("utf-8")
    if len(data) > SNIFF_TEXT_BYTES:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return bool(data) and not any(
        unicodedata.category(c) == "Cc" and c not in "\t\n\r\f" for c in text
    )


def _named_type(name: str) -> str | None:
    return _NAMED.get(Path(name).suffix.lower())


def _clean_name(name: str, found: str | None) -> str:
    """A name to show: no folders, no control characters, bounded; one made up for
    bytes given without a name."""
    name = "".join(
        c for c in Path(name.replace("\\", "/")).name if unicodedata.category(c)[0] != "C"
    )
    name = name.strip()[-MAX_NAME_CHARS:]
    if name:
        return name
    suffix = {PNG: ".png", JPEG: ".jpg", GIF: ".gif", WEBP: ".webp", PDF: ".pdf", TEXT: ".txt"}
    return f"attachment{suffix.get(found or '', '')}"


def _a(content_type: str) -> str:
    shown = _SHOWN[content_type]
    return f"{'an' if shown[0] in 'AEIOU' else 'a'} {shown}"


def _size(n: int) -> str:
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def data_url(content_type: str, data: bytes) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode('ascii')}"


def text_of(attachment: Attachment, data: bytes) -> str:
    """The text of a document attachment (a PDF's text layer, a text file's text), at most
    `MAX_TEXT_CHARS`; empty for an image. `AttachmentUnreadable` for a PDF without the
    `documents` extra, or one that cannot be read."""
    if attachment.content_type == TEXT:
        return data.decode("utf-8", errors="replace")[:MAX_TEXT_CHARS]
    if attachment.content_type != PDF:
        return ""
    try:
        pages = pdf_pages(data, MAX_TEXT_CHARS)
    except ImportError:
        raise AttachmentUnreadable(
            f"reading {attachment.name!r} (a PDF) needs pypdf: pip install -e '.[documents]'"
        ) from None
    except ValueError as e:
        raise AttachmentUnreadable(f"{attachment.name!r} cannot be read as a PDF: {e}") from None
    text = "".join(page + "\n" for page in pages)
    return text[:MAX_TEXT_CHARS]


def pdf_pages(data: bytes, max_chars: int | None = None) -> list[str]:
    """A PDF's text layer, page by page, the pages read until `max_chars` in all (the
    one reader of PDFs: attachments' and knowledge's). ImportError without the
    `documents` extra (pypdf); ValueError, one line, for a file it cannot read."""
    import pypdf

    # pypdf logs what it repairs in a damaged file: the caller says it in one line.
    pypdf_log = logging.getLogger("pypdf")
    level = pypdf_log.level
    pypdf_log.setLevel(logging.CRITICAL)
    pages: list[str] = []
    try:
        read = 0
        for page in pypdf.PdfReader(io.BytesIO(data)).pages:
            pages.append(page.extract_text() or "")
            read += len(pages[-1])
            if max_chars is not None and read >= max_chars:
                break
    except Exception as e:  # pypdf raises many kinds on a broken file: each is one line here
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(first[:120]) from None
    finally:
        pypdf_log.setLevel(level)
    return pages


Part = Literal["text", "image", "document"]


def kind(attachment: Attachment) -> Part:
    """How a backend sends it: a text file as text, an image as an image, a PDF as a
    document."""
    if attachment.is_image:
        return "image"
    return "document" if attachment.content_type == PDF else "text"


def as_text(attachment: Attachment, data: bytes) -> str:
    """A text attachment as the text part a model reads, its name first."""
    return f"[attached file {attachment.name}]\n{data.decode('utf-8', errors='replace')}"
