"""The turn so far as a provider-neutral conversation, for chat backends.

Providers differ in shape (Chat Completions messages, Bedrock Converse content
blocks) but agree on the rules this module enforces: the question comes first,
every tool call the model made gets exactly one result (its observation, its
rejection, or "not run" when a sibling call was rejected and the model planned
again), and the model's own "continue" text stays in the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.model import ModelRequest
from agent.types import StepKind, ToolCall

NOT_RUN = "not run: another call of this plan was invalid; plan again"


@dataclass(frozen=True)
class UserText:
    text: str


@dataclass(frozen=True)
class AssistantText:
    text: str


@dataclass(frozen=True)
class AssistantCalls:
    calls: list[ToolCall]


@dataclass(frozen=True)
class ToolResult:
    call_id: str
    ok: bool
    text: str


Entry = UserText | AssistantText | AssistantCalls | ToolResult


def transcript(request: ModelRequest) -> list[Entry]:
    entries: list[Entry] = [UserText(request.question)]
    pending: list[str] = []

    def flush() -> None:
        entries.extend(ToolResult(call_id, False, NOT_RUN) for call_id in pending)
        pending.clear()

    for step in request.steps:
        if step.kind is StepKind.PLAN:
            flush()
            entries.append(AssistantCalls(list(step.calls)))
            pending.extend(c.id for c in step.calls)
        elif step.kind in (StepKind.REJECTED, StepKind.OBSERVATION) and step.observation:
            obs = step.observation
            entries.append(ToolResult(obs.call_id, obs.ok, obs.text))
            if obs.call_id in pending:
                pending.remove(obs.call_id)
        elif step.kind is StepKind.CONTINUE:
            flush()
            entries.append(AssistantText(step.text))
    flush()
    return entries
