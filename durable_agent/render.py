"""Tool results to compact text for the model (the parse-output step).

A result reaches the model whole, up to a per-tool limit (`@tool(max_result_chars=)`,
else the agent's `Agent.max_result_chars`, else `MAX_OBSERVATION_CHARS`): `Key:
value.` sentences for records, one line per item for lists, and past the limit a
visible marker, so the model knows it read part of it. The limit is about the
model's context. The turn's story (steps, stream, Web UI) shows a preview of each
result (`preview`).
"""

from __future__ import annotations

from typing import Any

MAX_OBSERVATION_CHARS = 100_000
"""Default cap of one tool result as the model reads it (about 25k tokens)."""
MAX_RESULT_CHARS_LIMIT = 250_000
"""The most a tool or agent may let one result be: a result travels as one payload,
and Temporal refuses a payload over 2 MB by failing the workflow task forever, so
even a result of multi-byte, escaped characters must stay well under it."""
PREVIEW_CHARS = 2000
"""What the turn's story shows of a result (the model reads it whole)."""
TRUNCATION_MARKER = "… [truncated {n} more characters]"


def render_result(value: Any, limit: int = MAX_OBSERVATION_CHARS) -> str:
    return truncate(_render(value), limit)


def truncate(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + TRUNCATION_MARKER.format(n=len(text) - limit)


def preview(text: str) -> str:
    """A result as the turn's story shows it: its start, and how much more there is."""
    return truncate(text, PREVIEW_CHARS)


def _render(value: Any) -> str:
    if value is None:
        return "(no result)"
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return (
            " ".join(
                _sentence(f"{_label(k)}: {_render(v)}")
                for k, v in value.items()
                if v not in (None, "", [], {})
            )
            or "(empty)"
        )
    if isinstance(value, (list, tuple)):
        if not value:
            return "(nothing found)"
        return " ".join(f"[{i}] {_render(v)}" for i, v in enumerate(value, 1))
    return str(value)


def _sentence(text: str) -> str:
    return text if text.endswith((".", "!", "?", "…")) else text + "."


def _label(key: str) -> str:
    text = str(key).replace("_", " ").strip()
    return text[:1].upper() + text[1:]
