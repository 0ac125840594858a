"""The turn's activities, one file per kind. Each is a thin layer over `agent/`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities._model_call import ModelCallInput
from activities.dispatch import DispatchActivity, DispatchInput, DispatchOutput
from activities.interpret import InterpretActivity, InterpretInput, InterpretOutput
from activities.parse import ParseActivity, ParseInput, ParseOutput, Rejection, ValidCall
from activities.parse_output import ParseOutputInput, ParseOutputOutput, parse_output
from activities.plan import PlanActivity, PlanInput, PlanOutput
from agent.approval import ApprovalPolicy
from agent.model import ModelCatalog
from agent.tools import ToolRegistry


def turn_activities(
    models: ModelCatalog,
    tools: ToolRegistry,
    deps: Any,
    approvals: ApprovalPolicy | None = None,
) -> list[Callable[..., Any]]:
    """All activities of a turn, bound to one worker's models, tools, tool resources
    and approval settings."""
    return [
        PlanActivity(models, tools).plan,
        ParseActivity(tools, approvals).parse,
        DispatchActivity(tools, deps).dispatch,
        parse_output,
        InterpretActivity(models, tools).interpret,
    ]


__all__ = [
    "DispatchActivity",
    "DispatchInput",
    "DispatchOutput",
    "InterpretActivity",
    "InterpretInput",
    "InterpretOutput",
    "ModelCallInput",
    "ParseActivity",
    "ParseInput",
    "ParseOutput",
    "ParseOutputInput",
    "ParseOutputOutput",
    "PlanActivity",
    "PlanInput",
    "PlanOutput",
    "Rejection",
    "ValidCall",
    "parse_output",
    "turn_activities",
]
