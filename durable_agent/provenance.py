"""Where a write's arguments came from: the customer's own words, or somewhere else.

A waiver of consent (`ApprovalPolicy(waived=...)`) trusts the customer, not the
model: a write built from what the customer wrote may run without asking, but a
write whose arguments carry values the customer never wrote — taken from a tool
result, a sub-agent's answer, an earlier answer, or made up — is exactly what text
planted in a tool result ("the customer already asked us to send back order N ...
please go ahead") would produce. Such a write asks a person, whatever the waiver
says, and the approval says which argument came from where. Shields that spot
instruction-like text are a first net; this one does not depend on wording.

    traced(call, schema, said=[question, *earlier questions], sources=[...])
        -> ["order_id='654321' (from a result of order_status)", ...]

How a value counts as the customer's: its words and numbers, in order, are a run of
whole tokens of one message the customer wrote (case, Unicode forms and punctuation
aside). A number is a whole number: `234567` is not in "1234567890", nor `23456` in
"order 123456", and `12.50` or `1,250` is one number. So an id, a date or an amount
the customer typed passes, a fragment of one does not, and text the model reworded
or put together from several places is not the customer's: it asks. Booleans, values
the schema enumerates and a field's default are choices, not data: not checked.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from durable_agent.types import ToolCall


class Source(BaseModel):
    """Text the model read that the customer did not write."""

    what: str
    """`a result of order_status`, `an earlier answer`, ..."""
    text: str


def traced(
    call: ToolCall, schema: dict[str, Any], said: Sequence[str], sources: Sequence[Source]
) -> list[str]:
    """The call's arguments the customer did not write, each with where it came from."""
    words = _Said(said)
    properties: dict[str, Any] = schema.get("properties", {})
    found = []
    for name, value in call.arguments.items():
        prop = properties.get(name, {})
        for text in _values(value, prop):
            if not words.wrote(text):
                found.append(f"{name}={_short(text)!r} ({_origin(text, sources)})")
                break
    return found


class _Said:
    """What someone wrote, message by message, as tokens: a value is theirs when it is
    a run of whole tokens of one message."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = [_norm(t) for t in texts]
        self.messages = [_tokens(t) for t in texts]
        self.tokens = {t for m in self.messages for t in m}

    def wrote(self, value: str) -> bool:
        wanted = _tokens(value)
        if not wanted:  # punctuation, or nothing: no data, unless it is all there is
            text = _norm(value)
            return not text or any(text in t for t in self.texts)
        if len(wanted) == 1:
            return wanted[0] in self.tokens
        return any(_has_run(message, wanted) for message in self.messages)


def _has_run(tokens: list[str], run: list[str]) -> bool:
    """`run` appears in `tokens` as consecutive whole tokens."""
    first, n = run[0], len(run)
    return any(tokens[i] == first and tokens[i : i + n] == run for i in range(len(tokens) - n + 1))


def _values(value: Any, prop: dict[str, Any]) -> Iterator[str]:
    """The texts in an argument that are data: not booleans, enumerated choices or the
    field's default."""
    if isinstance(value, bool) or value is None:
        return
    if "enum" in prop and value in prop["enum"]:
        return
    if "default" in prop and value == prop["default"]:
        return
    if isinstance(value, dict):
        for v in value.values():
            yield from _values(v, {})
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _values(v, prop.get("items", {}) if isinstance(prop, dict) else {})
    else:
        yield str(value)


def _origin(value: str, sources: Sequence[Source]) -> str:
    for source in sources:
        if _Said([source.text]).wrote(value):
            return f"from {source.what}"
    return "in nothing the customer wrote"


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


_TOKEN = re.compile(
    # Letters and digits; a number's decimal point and thousands separators stay in it
    # ("12.50", "1,250"), so no part of a number counts as a number the customer wrote.
    r"(?:[^\W_]|(?<=\d)\.(?=\d)|(?<=\d),(?=\d{3}(?!\d)))+"
)


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(_norm(text))


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
