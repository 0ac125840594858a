"""Tool results to compact text for the model (the parse-output step).

Every observation is kept in the turn's history and re-sent to the model on
each later call, so it is kept short: `Key: value.` sentences for records,
one line per item for lists, and a hard cap with a visible marker.
"""

from __future__ import annotations

from typing import Any

MAX_OBSERVATION_CHARS = 2000
TRUNCATION_MARKER = "… [truncated {n} more characters]"


def render_result(value: Any, limit: int = MAX_OBSERVATION_CHARS) -> str:
    return truncate(_render(value), limit)


def truncate(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + TRUNCATION_MARKER.format(n=len(text) - limit)


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
