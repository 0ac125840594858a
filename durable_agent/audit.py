"""The audit of consent: every write a person decided on, with who asked, who decided,
what exactly they decided on, and what came of it.

    rows = await agents.audit(tenant="acme", since=datetime(2026, 12, 1, tzinfo=UTC))
    durable-agent audit --tenant acme --since 7d --json > audit.jsonl

A row is one decision a turn took on one call (`Consent`, recorded in its `decision`
step): the call's tool, arguments and sha256 (`approval.consent_hash`), the decider's
name and principal, the front end, the time, and the call's result as the model read
it (`ran`: whether it ran). Refused deciders (`NotAnApprover`) are counted on the row
of the call they tried to decide. A write that ran without asking (its consent waived
by the agent's approval policy) has a row too: approved by no one, `via` `waived`, at
the time it was sent (turns recorded before this have no such record, and no row).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from durable_agent.principal import Principal
from durable_agent.types import WAIVED, Step, StepKind

MAX_AUDIT_TURNS = 10_000
"""The most turns one audit reads (`limit`): each is read whole."""


class AuditRow(BaseModel):
    """One decision on one write, and what came of it."""

    workflow_id: str
    tenant: str
    """Who asked: their tenant and user (the turn's `AgentTenant`, `AgentCustomer`)."""
    user: str
    tool: str
    call_id: str
    arguments: dict[str, Any]
    call_hash: str
    """sha256 of the call's tool and arguments, canonical: what the decision covers."""
    approved: bool
    by: str
    principal: Principal | None = None
    """Who decided, as the application authenticated them (None: a name only)."""
    via: str = ""
    at: datetime
    reason: str = ""
    refused: int = 0
    """Decisions on this call the turn refused first (the decider may not decide)."""
    ran: bool = False
    """It ran: approved, and its tool answered without an error (`result`)."""
    result: str = ""
    """Its result as the model read it, or why it did not run."""

    def line(self) -> str:
        if self.via == WAIVED:
            decided = "ran unasked (consent waived)"
        else:
            who = self.principal.key if self.principal is not None else "-"
            verb = "approved" if self.approved else "rejected"
            decided = f"{verb} by {self.by} ({who}{', via ' + self.via if self.via else ''})"
        refused = f"  ({self.refused} refused)" if self.refused else ""
        return (
            f"{self.at.astimezone().strftime('%Y-%m-%d %H:%M:%S')}  {self.workflow_id}  "
            f"{self.tenant}:{self.user}  {self.tool}  {decided}  sha256:{self.call_hash[:16]}  "
            f"{'ran' if self.ran else 'not run'}: {self.result[:80]!r}{refused}"
        )


def rows_of(workflow_id: str, tenant: str, user: str, steps: list[Step]) -> list[AuditRow]:
    """A turn's decisions, each with its call's arguments and result, in order."""
    rows: list[AuditRow] = []
    refused: dict[str, int] = {}
    for i, step in enumerate(steps):
        consent = step.consent
        if step.kind not in (StepKind.DECISION, StepKind.TOOL_CALL) or consent is None:
            continue
        if consent.refused:
            refused[consent.call_id] = refused.get(consent.call_id, 0) + 1
            continue
        call = next((c for c in step.calls if c.id == consent.call_id), None)
        result, ran = _outcome(steps[i + 1 :], consent.call_id, consent.approved)
        rows.append(
            AuditRow(
                workflow_id=workflow_id,
                tenant=tenant,
                user=user,
                tool=consent.tool,
                call_id=consent.call_id,
                arguments=call.arguments if call is not None else {},
                call_hash=consent.call_hash,
                approved=consent.approved,
                by=consent.by,
                principal=consent.principal,
                via=consent.via,
                at=consent.at,
                reason=consent.reason,
                refused=refused.pop(consent.call_id, 0),
                ran=ran,
                result=result,
            )
        )
    return rows


def _outcome(after: list[Step], call_id: str, approved: bool) -> tuple[str, bool]:
    """The call's result after its decision: the first observation of it."""
    for step in after:
        observation = step.observation
        if step.kind is StepKind.OBSERVATION and observation and observation.call_id == call_id:
            return observation.text, approved and observation.ok
    return "", False


__all__ = ["MAX_AUDIT_TURNS", "AuditRow", "rows_of"]
