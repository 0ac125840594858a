"""Bounds on what a model's reply and a round of tool results bring into a turn.

Temporal refuses a payload over 2 MB, and a workflow task that would write one fails
again and again: the turn stays running with nothing to show, and a reply of
thousands of calls can keep one workflow task past its deadlock timeout. So what the
model says has a bound where it enters the turn (as its model-call activity returns
it), and so has what a round of results sends back to the model. Nothing is dropped
silently: a call over a bound gets a result saying which bound, and what to do.
"""

from __future__ import annotations

import json

from durable_agent.conversation import MAX_OPAQUE_CHARS
from durable_agent.model import Reply
from durable_agent.render import truncate
from durable_agent.types import Observation, PendingApproval, ToolCall

MAX_CALLS_PER_ROUND = 64
"""Default of `Agent.max_calls_per_round`: the calls of one reply that run."""
MAX_CALLS_PER_ROUND_LIMIT = 512
"""The most an agent may let one reply make."""
MAX_ARGUMENTS_CHARS = 100_000
"""One call's arguments, as JSON: a tool takes a reference to a large value, not the value."""
MAX_REPLY_CHARS = 500_000
"""A reply's text and all its calls' arguments together."""
MAX_ROUND_RESULTS_CHARS = 1_000_000
"""The results of one round together, as the model reads them next."""
MAX_INSTRUCTIONS_CHARS = 100_000
"""An agent's instructions for one turn, as its instructions function returns them: they
travel with the turn (in its history, and with every model call), so one text over this
ends the turn at once, as a failed instructions function does, rather than leave it
retrying a workflow task Temporal refuses (a 2 MB payload)."""
MAX_RESULTS_IN_FLIGHT_CHARS = 600_000
"""The results the calls running at once may return (by their tools' result limits):
one workflow task takes them all in (Temporal's gRPC messages stop at 4 MB). The quick
reads of a round past it run as regular activities, and calls past it wait their turn."""


def bounded_reply(reply: Reply, max_calls: int = MAX_CALLS_PER_ROUND) -> Reply:
    """`reply` within the bounds: its text cut with the truncation marker; calls past
    `max_calls` answered by one refusal (on the first of them; the rest are left out of
    the conversation); a call whose arguments are over their bound kept with none, and
    refused with a result that says so; a provider's opaque part over
    `MAX_OPAQUE_CHARS` left out (its backend then asks without it: Anthropic's next
    call of the round thinks no more). `reply` itself is left as it was."""
    if reply.opaque is not None and len(reply.opaque.model_dump_json()) > MAX_OPAQUE_CHARS:
        reply = reply.model_copy(update={"opaque": None})
    text = truncate(reply.text, MAX_REPLY_CHARS)
    budget = MAX_REPLY_CHARS - len(text)
    calls: list[ToolCall] = []
    for at, call in enumerate(reply.calls):
        if at == max_calls:
            more = len(reply.calls) - max_calls
            calls.append(
                _refused(
                    call,
                    f"this reply made {len(reply.calls):,} tool calls, and at most "
                    f"{max_calls:,} run in one round: the first {max_calls:,} ran; this one "
                    f"and the {more - 1:,} after it did not. Make the rest in later rounds.",
                )
            )
            break
        size = _size(call)
        if size > MAX_ARGUMENTS_CHARS or size > budget:
            bound = min(MAX_ARGUMENTS_CHARS, budget)
            calls.append(
                _refused(
                    call,
                    f"its arguments are {size:,} characters as JSON, over the {bound:,} "
                    "this call could take: it did not run. Pass a large value by reference "
                    "(an id, a path, a URL), or split the work into smaller calls.",
                )
            )
            continue
        budget -= size
        calls.append(call)
    if text is reply.text and calls == reply.calls:
        return reply
    return reply.model_copy(update={"text": text, "calls": calls})


def _size(call: ToolCall) -> int:
    raw = call.raw_arguments if call.raw_arguments is not None else ""
    return len(json.dumps(call.arguments, ensure_ascii=False, default=str)) + len(raw)


def _refused(call: ToolCall, why: str) -> ToolCall:
    """`call` with no arguments, refused by parse with `why`."""
    return ToolCall(id=call.id, name=call.name, arguments={}, error=why)


def fit_round(
    results: dict[str, Observation], budget: int = MAX_ROUND_RESULTS_CHARS
) -> dict[str, Observation]:
    """A round's results within `budget` characters together: when they are over it,
    each gets an equal share, and one shorter than its share leaves the rest to the
    others; a result cut keeps the truncation marker. Deterministic: workflow code."""
    sizes = {k: len(o.text) for k, o in results.items()}
    if sum(sizes.values()) <= budget:
        return results
    shares: dict[str, int] = {}
    left, waiting = budget, sorted(sizes, key=lambda k: (sizes[k], k))
    while waiting:
        share = left // len(waiting)
        key = waiting.pop(0)
        shares[key] = min(sizes[key], share)
        left -= shares[key]
    return {
        k: o
        if shares[k] >= sizes[k]
        else o.model_copy(update={"text": truncate(o.text, shares[k])})
        for k, o in results.items()
    }


MEMO_CALL_CHARS = 1_000
"""One call awaiting a decision, as the turn's memo lists it: its arguments and the
reason it waits, each cut to this (the memo is one payload, whatever the round holds)."""


def for_memo(waiting: PendingApproval) -> dict[str, object]:
    """A call awaiting a decision as the turn's memo holds it: whole when it is small,
    else with its arguments shown as cut JSON text (its id and tool, what a decision
    needs, are always whole)."""
    call = waiting.call
    shown = json.dumps(call.arguments, ensure_ascii=False, default=str)
    if len(shown) > MEMO_CALL_CHARS:
        call = call.model_copy(
            update={"arguments": {"arguments": truncate(shown, MEMO_CALL_CHARS)}}
        )
    why = truncate(waiting.why, MEMO_CALL_CHARS)
    return waiting.model_copy(update={"call": call, "why": why}).model_dump(mode="json")
