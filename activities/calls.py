"""A tool call as parse validated it (`ValidCall`): what the turn dispatches, and what
it carries across continue-as-new (`workflows/carry.py`). Apart from the parse
activity, whose imports are the worker's, so the client side reads a turn's carry
without loading the activities."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from durable_agent.subagents import SubAgent
from durable_agent.types import ToolCall

__all__ = ["AS_ASKED", "ValidCall"]

AS_ASKED = ToolCall(id="", name="")
"""A valid call's `call` when it stands as the model made it (see `ValidCall.call`)."""


class ValidCall(BaseModel):
    call: ToolCall = AS_ASKED
    """The call with its arguments as validated (normalised) by the tool's model;
    `AS_ASKED` when that is the round's `at`-th call as the model made it, which the
    result then leaves out (the turn has it): `ParseOutput.restored` puts it back."""
    at: int = 0
    timeout: timedelta
    max_attempts: int
    side_effects: bool = False
    quick: bool = False
    """A quick read: dispatched as a local activity."""
    result_chars: int = 0
    """How much of its result the model reads (the tool's limit): the turn runs no
    more calls at once than one workflow task can take the results of (0: no bound,
    as turns recorded before it had)."""
    approval: str = ""
    """Why the call needs a person's consent before it runs; empty when it does not."""
    approvers: list[str] = []
    """Who may decide on it (`ApprovalPolicy.approvers_of`: `asker`, `role:NAME`);
    empty: anyone who can reach the turn."""
    return_direct: bool = False
    """Its result is the turn's answer (no interpret)."""
    checked: bool = False
    """The tool checks a call before consent is asked (`Tool.check`)."""
    agent: SubAgent | None = None
    """An agent tool: the turn runs the sub-agent's own turn as a child workflow."""
    tool_schema: str = ""
    """A hash of the tool's schema (`rewind.schema_digest`), which the call's step
    records: a fork on the agent as served now tells a changed tool by it."""
    in_workflow: str = ""
    """A built-in the workflow runs itself (`Tool.in_workflow`: `wait`, `wait_for_event`)."""
