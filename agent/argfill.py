"""Filling a tool's arguments from the user's own words, by its JSON schema.

Text-completion models (and the offline model) often name a tool without
usable arguments; the schema's `pattern`s find the ids in the question instead,
as the original e-commerce agent's tool parser did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agent.tools import ToolSpec


@dataclass(frozen=True)
class Param:
    name: str
    pattern: re.Pattern[str] | None
    """Unanchored pattern to find the value in a text; None for free text."""
    description: str


def required_params(spec: ToolSpec) -> tuple[Param, ...]:
    props: dict[str, Any] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    params = []
    for name, schema in props.items():
        if name not in required:
            continue
        pattern = schema.get("pattern")
        compiled = None
        if pattern:
            body = pattern.removeprefix("^").removesuffix("$")
            compiled = re.compile(rf"(?<![\w-])(?:{body})(?![\w-])", re.IGNORECASE)
        params.append(Param(name, compiled, schema.get("description", name)))
    return tuple(params)


def fill_arguments(params: tuple[Param, ...], question: str) -> dict[str, str] | None:
    """Arguments found in the question, or None when a required id is missing.
    Free-text parameters get the whole question."""
    args = {}
    for p in params:
        if p.pattern is None:
            args[p.name] = question
            continue
        m = p.pattern.search(question)
        if m is None:
            return None
        args[p.name] = m.group(0)
    return args
