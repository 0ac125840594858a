"""Consent before side effects: which calls wait for a person, and the records of it.

A tool that changes something in the world (`@tool(side_effects=True)`) needs an
approval by default; a tool can also ask for one itself (`@tool(approval=True)`)
or waive it (`@tool(approval=False)`). The worker's settings have the last word:

    AGENT_APPROVAL_REQUIRED=order_status,search_policies   also these tools
    AGENT_APPROVAL_WAIVED=start_return                     not these (or `*`: none
                                                           at all, for trusted deployments)

A call that needs approval waits, durably, for a decision (the turn's `decide`
update) or for the approval timeout; a rejected or expired call becomes a
result the model reads, an approved one runs exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, field_validator

from durable_agent.types import ToolCall

ALL = "*"


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


WORKER_SETTINGS = "the worker's approval settings (AGENT_APPROVAL_REQUIRED / _WAIVED)"
AGENT_POLICY = "its approval policy (Agent(approvals=ApprovalPolicy(...)))"


@dataclass(frozen=True)
class ApprovalPolicy:
    """The worker's word on approvals, over what each tool declares."""

    required: frozenset[str] = field(default_factory=frozenset)
    waived: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApprovalPolicy:
        env = os.environ if environ is None else environ
        return cls(
            required=_names(env.get("AGENT_APPROVAL_REQUIRED", "")),
            waived=_names(env.get("AGENT_APPROVAL_WAIVED", "")),
        )

    def check(self, known: Iterable[str], source: str = WORKER_SETTINGS) -> None:
        """Refuse a policy that names tools the agent does not have (a typo would
        silently leave a write unguarded, or guard nothing); `source` says whose
        policy it is."""
        unknown = sorted((self.required | self.waived) - set(known) - {ALL})
        if unknown:
            raise ValueError(
                f"{source} names unknown tools: {', '.join(unknown)} "
                f"(its tools: {', '.join(sorted(known)) or 'none'})"
            )

    def needs_approval(self, tool: str, declared: bool) -> bool:
        if tool in self.required or ALL in self.required:
            return True
        if tool in self.waived or ALL in self.waived:
            return False
        return declared


class ApprovalDecision(BaseModel):
    """Input of the turn's `decide` update."""

    call_id: str
    approved: bool
    by: str = Field(min_length=1, max_length=100)
    """Who decided (an operator's name, `customer`, ...), for the record."""
    reason: str = Field(default="", max_length=500)

    @field_validator("by", "reason")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return " ".join(v.split())


class ApprovalResult(BaseModel):
    """Output of the `decide` update: what was recorded."""

    call_id: str
    approved: bool
    tool: str
    later: bool = False
    """Recorded while no worker of the turn's version ran: it applies when one runs
    the turn (a worker of that version, or the current one after a move)."""


def declined(call: ToolCall, decision: ApprovalDecision) -> str:
    """What the model reads for a call a person refused."""
    because = f": {decision.reason}" if decision.reason else ""
    return f"Not done: {call.render()} was declined by {decision.by}{because}. Nothing was changed."


def expired(call: ToolCall, waited: str) -> str:
    return (
        f"Not done: nobody approved {call.render()} within {waited}, so it was not run. "
        "Nothing was changed."
    )
