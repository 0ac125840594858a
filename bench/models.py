"""Models for the benchmark: multi-iteration turns, and the three model-call tasks."""

from __future__ import annotations

import asyncio
import time

from durable_agent.conversation import AssistantMessage, latest_results
from durable_agent.model import ModelCatalog, ModelRequest, Reply
from durable_agent.shop.phrasebook import offline_model
from durable_agent.stream import TextSink
from durable_agent.types import ToolCall, Usage

ONE_CALL = Usage(model_calls=1)


def _rounds_so_far(request: ModelRequest) -> list[AssistantMessage]:
    return [m for m in request.messages if isinstance(m, AssistantMessage) and m.calls]


class RepeatingModel:
    """Plans like the offline model, then asks for the same calls again until
    `iterations` rounds of tools have run."""

    provider = "offline"

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.name = f"repeat-{iterations}"
        self._offline = offline_model()

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await self._offline.plan(request)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        rounds = _rounds_so_far(request)
        if len(rounds) < self.iterations:
            again = [c.model_copy(update={"id": ""}) for c in rounds[-1].calls]
            return Reply(calls=again, usage=ONE_CALL)
        return await self._offline.interpret(request)


ORDER = ToolCall(id="", name="order_status", arguments={"order_id": "123456"})
RETURN = ToolCall(id="", name="return_status", arguments={"return_id": "rtn001"})

TASKS: dict[str, list[list[ToolCall]]] = {
    "one tool": [[ORDER]],
    "two tools in sequence": [[ORDER], [RETURN]],
    "two tools at once": [[ORDER, RETURN]],
}
"""Rounds of calls per task; a model that needs the first result before asking
for the second call must wait for it (sequence), otherwise asks for both at once."""

EXPECTED_MODEL_CALLS = {"one tool": 2, "two tools in sequence": 3, "two tools at once": 2}

TASK_QUESTION = "Which item was ordered for 123456, and where is return rtn001?"
"""A question that names both ids the tasks look up (the shields let a call through
only for ids the customer or the question brought in)."""


class TaskModel:
    """Asks for one task's rounds of calls, one round per reply, then answers with
    the results. Decides from the conversation alone, as a real model does."""

    provider = "scripted"

    def __init__(self, task: str) -> None:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
        self.name = f"task-{task.replace(' ', '-')}"
        self._rounds = TASKS[task]

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return self._next(request)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return self._next(request)

    def _next(self, request: ModelRequest) -> Reply:
        done = len(_rounds_so_far(request))
        if done < len(self._rounds):
            return Reply(calls=[c.model_copy() for c in self._rounds[done]], usage=ONE_CALL)
        answer = " ".join(r.text for r in latest_results(request.messages))
        return Reply(text=answer, usage=ONE_CALL)


class TimedModel(TaskModel):
    """The one-tool task, whose answer is written in `pieces` pieces `gap_s` apart,
    each the time it was written (`time.time()`): a reader of the turn's stream
    subtracts it from the time it read it, which is how long the text took to reach
    it (batching included). Worker and reader share one clock: one machine."""

    def __init__(self, pieces: int = 20, gap_s: float = 0.05) -> None:
        super().__init__("one tool")
        self.name = "timed"
        self._pieces, self._gap_s = pieces, gap_s

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        reply = await super().interpret(request)
        if stream is None:
            return reply
        written = []
        for _ in range(self._pieces):
            piece = f"{time.time():.4f} "
            stream(piece)
            written.append(piece)
            await asyncio.sleep(self._gap_s)
        return Reply(text="".join(written).strip(), usage=ONE_CALL)


class PacedModel(TaskModel):
    """The two-tools-in-sequence task with every model call taking `ms` milliseconds,
    as a hosted model's does: turns long enough for a kill to catch them anywhere."""

    def __init__(self, ms: int) -> None:
        super().__init__("two tools in sequence")
        self.name = f"paced-{ms}"
        self._delay_s = ms / 1000

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        await asyncio.sleep(self._delay_s)
        return await super().plan(request)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        await asyncio.sleep(self._delay_s)
        return await super().interpret(request)


def bench_models() -> ModelCatalog:
    """`offline`, `repeat:N` for turns of N iterations, `task:<name>` per `TASKS`,
    `timed` (the one-tool task writing timestamps, for the stream's delays) and
    `paced:MS` (two tools in sequence, MS ms per model call, for the kills)."""
    return ModelCatalog(
        {
            "offline": lambda _: offline_model(),
            "repeat": lambda n: RepeatingModel(int(n or 1)),
            "task": lambda name: TaskModel(name),
            "timed": lambda _: TimedModel(),
            "paced": lambda ms: PacedModel(int(ms or 200)),
        }
    )
