"""Model fallback: a turn or an agent names its models in order, and the next one gets
the request when a call to one fails for good.

    Agent(name="support", model=["openai:gpt-4.1-mini", "bedrock:amazon.nova-lite-v1:0"])
    client.py ask --model openai:gpt-4.1-mini,bedrock:amazon.nova-lite-v1:0 "..."

Each model is its own activity, with its own retries (`MODEL_RETRY`): the Web UI shows
the attempts of the first, then the call to the next, and the turn's story a
`fallback` step between them. A model fails for good, and the next is asked, when:

- it stayed unavailable through its retries (5xx, throttling, timeouts), or ran out of
  its share of the turn's time (`share`): a model throttled past what the turn can
  wait for leaves the rest of the time to the next one;
- it will not take this request (`ModelCannotAnswer`: its context window, its content
  filter), or its reply could not be used (`InvalidModelOutput`).

Anything another model would meet as well stops the turn at once, with the first
model's error: credentials refused, a request refused as invalid, a model spec no
backend serves, a conversation that breaks the providers' rules.

A list travels as one string, its specs joined by commas (`TurnInput.model`, the
`AgentModel` search attribute at start): model specs never hold a comma
(`AGENT_MODEL_PRICES` separates them with commas too).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from temporalio.exceptions import ApplicationError, TimeoutError

from durable_agent.errors import (
    InvalidModelOutput,
    ModelCannotAnswer,
    ModelRequestRejected,
    ModelUnavailable,
    UnknownModel,
)

SEPARATOR = ","

MOVES_ON = frozenset(
    {ModelUnavailable.__name__, ModelCannotAnswer.__name__, InvalidModelOutput.__name__}
)
"""Errors of one model that another may not meet: the next model is asked."""


def specs(model: str | Sequence[str]) -> list[str]:
    """The model specs a turn's or an agent's `model` names, in order (empty: none, the
    default applies)."""
    given = model.split(SEPARATOR) if isinstance(model, str) else list(model)
    return [s.strip() for s in given if s.strip()]


def joined(models: str | Sequence[str]) -> str:
    """Model specs as one `model` string (`a,b`); a single spec as it is."""
    return SEPARATOR.join(specs(models))


def check(models: str | Sequence[str]) -> list[str]:
    """The specs, each checked to be one spec; ValueError saying which is not."""
    if not isinstance(models, str) and not all(isinstance(m, str) for m in models):
        raise ValueError(
            f"model: give specs as text, e.g. ['openai:gpt-4o', 'offline'], not {models!r}"
        )
    found = specs(models)
    for spec in found:
        if any(c.isspace() or not c.isprintable() for c in spec):
            raise ValueError(f"model spec {spec!r}: no spaces (e.g. openai:gpt-4o)")
    if len(set(found)) != len(found):
        raise ValueError(f"model: each spec once, not {joined(found)!r}")
    return found


def next_may_answer(cause: BaseException | None) -> bool:
    """Whether a model call that failed with `cause` (its activity's failure) leaves the
    request to the next model: the failure was this model's own, not the request's."""
    if isinstance(cause, TimeoutError):
        return True
    return isinstance(cause, ApplicationError) and cause.type in MOVES_ON


def share(time_left: timedelta, models_left: int) -> timedelta | None:
    """How much of the turn's time one model's attempts get when `models_left` (this
    one included) may still be asked: half, while another waits; all of it for the
    last (None: no bound of its own)."""
    return time_left / 2 if models_left > 1 else None


REASONS = {
    ModelRequestRejected.__name__: "request rejected",
    UnknownModel.__name__: "unknown model",
    ModelCannotAnswer.__name__: "will not take this request",
    ModelUnavailable.__name__: "unavailable",
    InvalidModelOutput.__name__: "reply unusable",
}
"""The kinds of a model's failure, as a turn's steps name them."""


def reason(cause: BaseException | None) -> str:
    """Why a model failed for good, for the story: the kind of failure (`REASONS`), never
    the error's own text, which may say what is the operator's alone (a key, a host):
    that goes to the worker's log and the trace, masked."""
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    if isinstance(cause, ApplicationError):
        return REASONS.get(cause.type or "", REASONS[InvalidModelOutput.__name__])
    return REASONS[ModelUnavailable.__name__]
