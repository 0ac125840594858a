"""The graceful answers a turn gives when it cannot finish normally."""

from __future__ import annotations

import re
from datetime import timedelta

from durable_agent.types import Step

DECLINE = "Sorry, I cannot answer that question."
"""What an agent says to a question its tools do not cover, unless it says otherwise."""

_REPLY_EXACTLY = re.compile(r"reply exactly:\s*(.+?)\s*$", re.IGNORECASE | re.DOTALL)


def decline_text(instructions: str) -> str:
    """What the instructions tell a model to say to a question it cannot answer
    (`... reply exactly: <text>`, as an agent's default instructions end), or DECLINE."""
    m = _REPLY_EXACTLY.search(instructions)
    return m.group(1).strip() if m else DECLINE


_CANNOT_DO = re.compile(
    r"(?:asks? for something|for what) (?:no tool|the tools) (?:can(?:not|'t)? do|cannot do)"
    r"[^:\n]*,\s*say:\s*(.+?)\s*(?:\n|$)",
    re.IGNORECASE,
)


def handoff_text(instructions: str) -> str:
    """What the instructions tell a model to say when asked for something no tool can
    do (`... something the tools cannot do, say: <text>` on a line of its own): where
    the customer can turn next. Empty when they say nothing of it."""
    m = _CANNOT_DO.search(instructions)
    return m.group(1).strip() if m else ""


def _found_so_far(steps: list[Step]) -> str:
    found = [s.observation.text for s in steps if s.observation and s.observation.ok]
    return f" Here is what I found so far: {' '.join(found[-3:])}" if found else ""


def step_limit(max_steps: int, steps: list[Step]) -> str:
    return f"Sorry, I could not finish within {max_steps} steps." + _found_so_far(steps)


def time_limit(max_duration: timedelta, steps: list[Step]) -> str:
    seconds = max_duration.total_seconds()
    return f"Sorry, I ran out of time ({seconds:g} s) before finishing." + _found_so_far(steps)


def token_limit(max_tokens: int, steps: list[Step]) -> str:
    return f"Sorry, I used up this question's budget of {max_tokens} tokens." + _found_so_far(steps)


def invalid_output(reason: str, repairs: int) -> str:
    tries = f" after {repairs} correction(s)" if repairs else ""
    return (
        f"Sorry, I could not give the answer in the form asked for{tries}: the last value "
        f"did not fit ({reason})."
    )


def cost_limit(max_cost: float, spent: float | None, steps: list[Step]) -> str:
    if spent is None:
        return (
            f"Sorry, I had to stop: this question's spending cap is {_dollars(max_cost)} and "
            "the cost of what I did so far is unknown." + _found_so_far(steps)
        )
    return (
        f"Sorry, I reached this question's spending cap of {_dollars(max_cost)}."
        + _found_so_far(steps)
    )


def budget_limit(why: str, steps: list[Step]) -> str:
    """`why`: the budget, what it holds and when it resets (`BudgetExceeded`'s line)."""
    return f"Sorry, I had to stop: {why}." + _found_so_far(steps)


def unpriced(max_cost: float, models: list[str]) -> str:
    named = ", ".join(models)
    return (
        f"Sorry, I cannot answer within a spending cap of {_dollars(max_cost)}: the price of "
        f"model {named} is unknown, so its cost cannot be capped. Whoever runs this agent "
        "can give it with AGENT_MODEL_PRICES (e.g. MODEL=0.15/0.60, US dollars per million "
        "input/output tokens), or ask without a cap."
    )


def _dollars(amount: float) -> str:
    return "$" + f"{amount:.6f}".rstrip("0").rstrip(".")


# A failure inside the worker is told to the customer in a fixed sentence of its kind,
# never in the error's own words: those may hold what is the operator's alone (an API
# key a provider repeats, a host, a query), and go to the worker's log and the trace
# only, masked (`durable_agent.redact`). The steps say the kind too (`fallback.reason`).


def instructions_failed() -> str:
    return (
        "Sorry, I cannot answer right now: this agent's instructions could not be "
        "prepared. Please try again in a moment."
    )


REFUSED_QUESTION = "Sorry, I can't help with that request."
"""What a turn answers when an input shield refused its question and its agent's own
words are unknown (a turn recorded before agents said them)."""
REFUSED_ANSWER = "Sorry, I can't share that answer: it held information I may not give out."


def unknown_agent(reason: str) -> str:
    return (
        f"Sorry, I cannot answer: {reason.split(';')[0]}. "
        "Whoever runs this service has to start a worker for it."
    )


def tools_unavailable() -> str:
    """The turn's tools cannot be had (`ToolListUnavailable`): the reason is the
    operator's, in the turn's steps; a question asked again gets today's tools."""
    return (
        "Sorry, I cannot go on with this request: the tools it started with are not "
        "available any more. Please ask again."
    )


PAYLOAD_UNAVAILABLE = (
    "Sorry, I cannot go on with this request: part of its record could not be read or "
    "saved. Please ask again."
)
"""A payload of the turn's record cannot be had (`PayloadUnavailable`): the payload and
the store are the operator's, in the turn's step."""


def model_failed(steps: list[Step]) -> str:
    return (
        "Sorry, I cannot answer right now: the language model is unavailable. "
        "Please try again in a moment." + _found_so_far(steps)
    )


def model_rejected() -> str:
    return (
        "Sorry, I cannot answer: the language model refused the request. "
        "Trying again will not help until whoever runs this agent fixes that."
    )


def model_unusable() -> str:
    return "Sorry, I cannot answer: the language model's reply could not be used."


def story(steps: list[Step]) -> str:
    """The steps as lines, for the Web UI's current details (Markdown-safe)."""
    return markdown_safe("\n".join(s.render() for s in steps))


_MARKDOWN = re.compile(r"([\\`*_\[\]<>#|$~])")


def markdown_safe(text: str) -> str:
    """The Web UI renders summaries and details as Markdown (with math: `$19.98 …
    $26.85` would become a formula): escape what it would interpret, so amounts and
    ids read as written."""
    return _MARKDOWN.sub(r"\\\1", text)


def markdown_plain(text: str) -> str:
    """`markdown_safe` undone, for a terminal."""
    return re.sub(r"\\([\\`*_\[\]<>#|$~])", r"\1", text)
