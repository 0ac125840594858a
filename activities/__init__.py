"""The turn's activities, one file per kind. Each is a thin layer over `agent/`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.dispatch import DispatchActivity, DispatchInput, DispatchOutput
from activities.interpret import InterpretActivity, InterpretInput, InterpretOutput
from activities.parse import ParseActivity, ParseInput, ParseOutput, Rejection, ValidCall
from activities.parse_output import ParseOutputInput, ParseOutputOutput, parse_output
from activities.plan import PlanActivity, PlanInput, PlanOutput
from agent.faults import Faults
from agent.model import ModelCatalog
from agent.tools import ToolRegistry


def turn_activities(
    models: ModelCatalog, tools: ToolRegistry, deps: Any, faults: Faults | None = None
) -> list[Callable[..., Any]]:
    """All activities of a turn, bound to one worker's models, tools and tool resources.

    `faults` (chaos runs only) injects transient failures into model and tool calls.
    """
    faults = faults or Faults()
    return [
        PlanActivity(models, tools, faults).plan,
        ParseActivity(tools).parse,
        DispatchActivity(tools, deps, faults).dispatch,
        parse_output,
        InterpretActivity(models, tools, faults).interpret,
    ]


__all__ = [
    "DispatchActivity",
    "DispatchInput",
    "DispatchOutput",
    "InterpretActivity",
    "InterpretInput",
    "InterpretOutput",
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
