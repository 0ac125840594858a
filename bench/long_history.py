"""What a long turn's histories say: their size, and how long each step took.

A step is a round of tools and the model call after it: it ends when that model
call's activity completes. Step k's time is the time between the completions of
model calls k - 1 and k (call 0 asked for the first round), read from the server's
own timestamps, across every run of the turn. Its parts (`breakdown`): the model
call, the tools (from the first scheduled to the last completed), the workflow
tasks, and the rest (waiting in task queues, local activities, a run continuing as
new).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

Match = Callable[[str], bool]
"""Whether an activity type is of a kind (a model call, a tool call)."""


def sizes(histories: Sequence[WorkflowHistory]) -> dict[str, Any]:
    """Bytes as JSON (as the Web UI and `temporal workflow show` give them), bytes as
    the server stores them (protobuf, what its 50 MB limit counts), and events."""
    return {
        "history_bytes_json": sum(len(h.to_json()) for h in histories),
        "history_bytes": sum(e.ByteSize() for h in histories for e in h.events),
        "history_events": sum(len(h.events) for h in histories),
        "runs": len(histories),
        "events_by_run": [len(h.events) for h in histories],
    }


def by_event(histories: Sequence[WorkflowHistory]) -> dict[str, dict[str, int]]:
    """Events, bytes (server) and bytes (JSON, each event as `to_json` writes it) by
    event type, and by activity type for scheduled activities and by marker: where a
    history's size comes from. Largest (JSON) first."""
    out: dict[str, dict[str, int]] = {}
    for h in histories:
        for e in h.events:
            kind = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                kind += f" ({e.activity_task_scheduled_event_attributes.activity_type.name})"
            elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                kind += f" ({e.marker_recorded_event_attributes.marker_name})"
            row = out.setdefault(kind, {"events": 0, "bytes": 0, "bytes_json": 0})
            row["events"] += 1
            row["bytes"] += e.ByteSize()
            row["bytes_json"] += len(json_format.MessageToJson(e)) + _JSON_LIST_ITEM
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes_json"]))


_JSON_LIST_ITEM = 2
"""What an event costs `to_json` besides itself: the list's comma and line break
(its indentation is counted with the event's lines, near enough)."""


@dataclass
class Activity:
    kind: str
    scheduled: float
    completed: float | None = None


def activities(histories: Sequence[WorkflowHistory]) -> list[Activity]:
    """Every activity of the runs, oldest first, with when it was scheduled and
    completed (None: it never was)."""
    out: list[Activity] = []
    for h in histories:
        by_id: dict[int, Activity] = {}
        for e in h.events:
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                kind = e.activity_task_scheduled_event_attributes.activity_type.name
                by_id[e.event_id] = Activity(kind, _time(e))
                out.append(by_id[e.event_id])
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                done = e.activity_task_completed_event_attributes.scheduled_event_id
                if done in by_id:
                    by_id[done].completed = _time(e)
    return out


def completed(histories: Sequence[WorkflowHistory], match: Match) -> int:
    return sum(a.completed is not None and match(a.kind) for a in activities(histories))


def step_ends(histories: Sequence[WorkflowHistory], is_model: Match) -> list[float]:
    """When each model call completed: step k ends at `[k]` (k = 0 is the first call)."""
    return sorted(
        a.completed for a in activities(histories) if is_model(a.kind) and a.completed is not None
    )


def step_times(ends: Sequence[float]) -> list[float]:
    """Seconds per step: `[k - 1]` is step k's."""
    return [b - a for a, b in zip(ends, ends[1:], strict=False)]


def median_ms(times: Sequence[float], first: int, last: int) -> float | None:
    """Median of steps `first`..`last` (1-based, inclusive) in milliseconds; None
    when none of them ran."""
    window = list(times[first - 1 : last])
    return round(statistics.median(window) * 1000, 2) if window else None


def breakdown(
    histories: Sequence[WorkflowHistory], is_model: Match, first: int, last: int
) -> dict[str, float]:
    """Medians (ms) over steps `first`..`last` of each part of a step."""
    ends = step_ends(histories, is_model)
    acts = activities(histories)
    tasks = _workflow_tasks(histories)
    parts: dict[str, list[float]] = {"model": [], "tools": [], "workflow_tasks": [], "rest": []}
    for k in range(first, min(last, len(ends) - 1) + 1):
        start, end = ends[k - 1], ends[k]
        inside = [a for a in acts if start < a.scheduled <= end]
        model = [a for a in inside if is_model(a.kind) and a.completed is not None]
        tools = [a for a in inside if not is_model(a.kind) and a.completed is not None]
        model_s = sum(a.completed - a.scheduled for a in model if a.completed)
        tools_s = (
            max(a.completed for a in tools if a.completed) - min(a.scheduled for a in tools)
            if tools
            else 0.0
        )
        wft_s = sum(b - a for a, b in tasks if start < a and b <= end)
        parts["model"].append(model_s)
        parts["tools"].append(tools_s)
        parts["workflow_tasks"].append(wft_s)
        parts["rest"].append(end - start - model_s - tools_s - wft_s)
    return {k: round(statistics.median(v) * 1000, 2) for k, v in parts.items() if v}


def ended(history: WorkflowHistory) -> str:
    """How the run ended, or why its workflow task keeps failing (the last reason)."""
    last_task_failure = ""
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attrs = e.workflow_task_failed_event_attributes
            last_task_failure = attrs.failure.message or EventType.Name(e.event_type)
    last = history.events[-1] if history.events else None
    if last is None:
        return ""
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
        reason = last.workflow_execution_terminated_event_attributes.reason
        failing = f"; its workflow task failing: {last_task_failure}" if last_task_failure else ""
        return f"terminated: {reason}{failing}"
    if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
        return f"failed: {last.workflow_execution_failed_event_attributes.failure.message}"
    if last_task_failure:
        return f"workflow task failing: {last_task_failure}"
    return ""


def _workflow_tasks(histories: Sequence[WorkflowHistory]) -> list[tuple[float, float]]:
    """(started, completed) of every workflow task that completed."""
    out = []
    for h in histories:
        started = 0.0
        for e in h.events:
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                started = _time(e)
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and started:
                out.append((started, _time(e)))
    return out


def _time(e: HistoryEvent) -> float:
    return e.event_time.seconds + e.event_time.nanos / 1e9
