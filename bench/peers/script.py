"""The peers' scripted model, as plain decisions each peer's model class wraps.

The same rounds of calls as `bench.models.TaskModel` (`bench.models.TASKS`), decided
from the conversation alone: how many tool results it holds says which round comes
next; with all of them in, the answer is the last round's results, as the agent's
scripted model answers.
"""

from __future__ import annotations

from durable_agent.bench.models import TASKS
from durable_agent.types import ToolCall


def next_calls(task: str, results_so_far: int) -> list[ToolCall]:
    """The round of calls to ask for once `results_so_far` tool results are in the
    conversation; empty when every round has its results (time to answer)."""
    answered = 0
    for calls in _rounds(task):
        answered += len(calls)
        if results_so_far < answered:
            return [c.model_copy() for c in calls]
    return []


def answer(task: str, results: list[str]) -> str:
    """The final answer: the texts of the last round's results."""
    return " ".join(results[-len(_rounds(task)[-1]) :])


def _rounds(task: str) -> list[list[ToolCall]]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    return TASKS[task]
