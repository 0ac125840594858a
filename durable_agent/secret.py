"""Secret context values, as the client and the history see them.

A caller marks context values secret: `Secret(value)` (pydantic's, re-exported as
`durable_agent.Secret`: its repr, str and JSON dump never show the value) or
`secret=[keys]` on `ask`/`start`/`chat`. `split` takes them out of the context; the
client stores them (`durable_agent/runtime/secret_refs.py`) and the context carries a
reference under `SECRETS_KEY`. `masked` replaces their values in what an activity
returns, before it enters the history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Secret, SecretStr

from durable_agent.errors import InvalidSecret

__all__ = ["SECRETS_KEY", "Secret", "masked", "shown", "split"]

SECRETS_KEY = "$secrets"
"""The context entry that holds a turn's secret reference (never a caller's own key:
`split` refuses it)."""

MASK = "[secret {}]"
"""What a secret's value becomes in a result that quotes it."""

MIN_MASKED_CHARS = 4
"""Shorter values are not masked: masking `a` would wreck every result (and a value
that short protects nothing)."""

SECRET_TYPES = (Secret, SecretStr)


def split(context: Any, keys: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]:
    """The context without its secrets, and the secrets (name: clear value): the
    top-level values that are `Secret`s, and those `keys` names. `InvalidSecret`, one
    line, for a key the context does not have, a `Secret` nested deeper, or a context
    that names `SECRETS_KEY` itself. A context that is no object is left for
    `checked_context` to refuse."""
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(context, Mapping):
        if keys:
            raise InvalidSecret("secret names context keys: give the context as an object")
        return context, {}
    context = dict(context)
    if SECRETS_KEY in context:
        raise InvalidSecret(f"the context key {SECRETS_KEY!r} is the runtime's: rename it")
    missing = [k for k in keys if k not in context]
    if missing:
        raise InvalidSecret(
            f"secret names {', '.join(map(repr, missing))}, which the context does not "
            "have: give the value in the context, or leave the name out"
        )
    secrets = {}
    for key, value in list(context.items()):
        if isinstance(value, SECRET_TYPES):
            secrets[key] = value.get_secret_value()
            del context[key]
        elif key in keys:
            secrets[key] = context.pop(key)
        elif _nested_secret(value):
            raise InvalidSecret(
                f"context[{key!r}] holds a Secret inside it: give secrets as top-level "
                "values of the context"
            )
    try:
        json.dumps(secrets, allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidSecret("a secret must be JSON data (a string, most often)") from None
    return context, secrets


def _nested_secret(value: Any) -> bool:
    # Iterative: a context nested 100,000 deep is refused by `checked_context` in one
    # line, never a RecursionError here.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, SECRET_TYPES):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def shown(context: Mapping[str, Any]) -> dict[str, Any]:
    """The context as a request's fingerprint sees it: its secrets by name only (their
    reference changes each time they are stored)."""
    ref = context.get(SECRETS_KEY)
    if not isinstance(ref, dict):
        return dict(context)
    return {**context, SECRETS_KEY: ref.get("keys", [])}


def masked(data: Any, secrets: Mapping[str, Any]) -> Any:
    """`data` (JSON data, or text) with every secret's value replaced by its name."""
    if not secrets:
        return data
    shown_as = {
        str(v): MASK.format(k) for k, v in secrets.items() if len(str(v)) >= MIN_MASKED_CHARS
    }
    return _masked(data, shown_as)


def _masked(data: Any, shown_as: Mapping[str, str]) -> Any:
    if isinstance(data, str):
        for value, mask in shown_as.items():
            data = data.replace(value, mask)
        return data
    if isinstance(data, dict):
        return {_masked(k, shown_as): _masked(v, shown_as) for k, v in data.items()}
    if isinstance(data, list):
        return [_masked(v, shown_as) for v in data]
    return data
