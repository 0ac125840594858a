"""An MCP server's question asked in the terminal, as `chat` asks for a tool's consent:
a URL to visit (then done, declined or cancelled), a yes or no (a form of no fields:
a server's request to use the agent's model), or a form, field by field. The answer
goes through `TurnHandle.answer`, checked there; one that does not fit is said in one
line and the form asked again."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from durable_agent.client import TurnHandle
from durable_agent.elicitation import Action, Question
from durable_agent.errors import AgentClientError, InvalidAnswer
from durable_agent.types import Step

__all__ = ["answer_question"]

Read = Callable[[str], Awaitable[str | None]]
"""A line the person types after a prompt; None when input ended."""
FIND_S = 10.0
"""How long the question a step announced is looked for in the turn's memo (written in
the same workflow task as the step: found at once, unless the server is slow)."""
CHOICES = "[y = accept / n = decline / c = cancel]"


async def answer_question(turn: TurnHandle, step: Step, read: Read) -> bool:
    """The question `step` announces, asked and answered. False when input ended before
    an answer (the question stays waiting for `answer`); True once it is answered, here
    or elsewhere."""
    question = await _waiting(turn, step)
    while question is not None:
        got = await _ask(question, read)
        if got is None:
            return False
        action, content = got
        try:
            await turn.answer(question.id, action=action, content=content, by="customer")
            return True
        except InvalidAnswer as e:
            print(f"error: {e}", file=sys.stderr, flush=True)  # and the form again
        except AgentClientError as e:  # no longer waiting: answered elsewhere, timed out
            print(f"error: {e}", file=sys.stderr, flush=True)
            return True
    return True


async def _waiting(turn: TurnHandle, step: Step) -> Question | None:
    """The question `step` announces, while it waits (None: answered meanwhile, or the
    turn cannot be read: its steps go on saying what happens)."""
    deadline = time.monotonic() + FIND_S
    while True:
        try:
            waiting = await turn.questions()
        except AgentClientError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return None
        for question in waiting:
            if f"({question.id})" in step.text:
                return question
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.1)


async def _ask(question: Question, read: Read) -> tuple[Action, Any] | None:
    fields = (question.requested_schema or {}).get("properties") or {}
    if question.mode == "url":
        reply = await read(f"  open {question.url} (at {question.domain}), then {CHOICES} ")
    elif not fields:  # a yes or no
        reply = await read("  [y/N] ")
    else:
        reply = await read(f"  fill in the form? {CHOICES} ")
    if reply is None:
        return None
    action = _action(reply)
    if action != "accept" or question.mode == "url" or not fields:
        return action, None
    content: dict[str, Any] = {}
    for name, prop in fields.items():
        typed = await read(f"    {_label(name, prop, required=name in _required(question))}: ")
        if typed is None:
            return None
        if typed.strip():  # left empty: its default, if it has one
            content[name] = _value(prop, typed.strip())
    return "accept", content


def _action(reply: str) -> Action:
    said = reply.strip().lower()
    return "accept" if said in ("y", "yes") else "cancel" if said in ("c", "cancel") else "decline"


def _required(question: Question) -> set[str]:
    required = (question.requested_schema or {}).get("required")
    return {str(name) for name in required} if isinstance(required, list) else set()


def _label(name: str, prop: dict[str, Any], *, required: bool) -> str:
    """`Seats (integer; required)`, `Plan (one of basic, pro; default "basic")`."""
    options = prop.get("enum") or (prop.get("items") or {}).get("enum")
    kind = f"one of {', '.join(map(str, options))}" if options else str(prop.get("type", ""))
    if prop.get("type") == "array":
        kind += ", separated by commas"
    notes = [kind]
    if "default" in prop:
        notes.append(f"default {json.dumps(prop['default'])}")
    elif required:
        notes.append("required")
    title = " ".join(str(prop.get("title") or name).split())[:80]
    return f"{title} ({'; '.join(notes)})"


def _value(prop: dict[str, Any], typed: str) -> Any:
    """What the person typed, as the field's type reads it; as typed when it does not
    read (the check against the form says what is wrong)."""
    kind = prop.get("type")
    if kind == "boolean":
        said = typed.lower()
        if said in ("y", "yes", "true", "n", "no", "false"):
            return said in ("y", "yes", "true")
        return typed
    if kind in ("integer", "number"):
        try:
            number = json.loads(typed)
        except ValueError:
            return typed
        return number if isinstance(number, int | float) and not isinstance(number, bool) else typed
    if kind == "array":
        return [part.strip() for part in typed.split(",") if part.strip()]
    return typed
