"""The turn's activities, one file per kind. Each is a thin layer over `agent/`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities._model_call import ModelCallInput
from activities.dispatch import DispatchActivity, DispatchInput, DispatchOutput
from activities.interpret import InterpretActivity, InterpretInput, InterpretOutput
from activities.parse import ParseActivity, ParseInput, ParseOutput, Rejection, ValidCall
from activities.parse_output import ParseOutputActivity, ParseOutputInput, ParseOutputOutput
from activities.plan import PlanActivity, PlanInput, PlanOutput
from activities.shield import ShieldActivity, ShieldInput, ShieldOutput
from durable_agent.approval import ApprovalPolicy
from durable_agent.model import ModelCatalog
from durable_agent.shields import ShieldSet
from durable_agent.tools import ToolRegistry


def turn_activities(
    models: ModelCatalog,
    tools: ToolRegistry,
    deps: Any,
    approvals: ApprovalPolicy | None = None,
    shields: ShieldSet | None = None,
) -> list[Callable[..., Any]]:
    """All activities of a turn, bound to one worker's models, tools, tool resources,
    approval settings and shields."""
    shields = shields or ShieldSet.none()
    return [
        ShieldActivity(shields).shield,
        PlanActivity(models, tools).plan,
        ParseActivity(tools, approvals).parse,
        DispatchActivity(tools, deps).dispatch,
        ParseOutputActivity(shields).parse_output,
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
    "ParseOutputActivity",
    "ParseOutputInput",
    "ParseOutputOutput",
    "PlanActivity",
    "PlanInput",
    "PlanOutput",
    "Rejection",
    "ShieldActivity",
    "ShieldInput",
    "ShieldOutput",
    "ValidCall",
    "turn_activities",
]
