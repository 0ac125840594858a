"""A scripted model for tests: replies come from queues you fill.

    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="order_status",
                                     arguments={"order_id": "123456"})])],
        decisions=[Reply(text="It shipped.")],
    )

`plans` answer `plan`, `decisions` answer `interpret`, `summaries` the summaries a long
turn asks for (`durable_agent.compaction`; none given: a digest of the calls). Its
context window is small (`context_window`, 32,000 tokens), so long turns in tests
compact their conversation. Each queue item is a
reply, an exception to raise (e.g. `ModelUnavailable()` for a transient failure
that Temporal retries), or a callable `(request) -> reply`. A queue that runs
dry repeats its last item, so `decisions=[Reply(calls=[...])]` asks for tools
forever (the "never finishes" model). Every request is recorded in `requests`
for assertions.

A request it has answered before (an attempt Temporal retried after its worker was
slow or gone) gets the same reply again, as a deterministic model would give: a
retry never moves the script on. One that raised moves on: the retry gets the next
item (`[ModelUnavailable(), Reply(...)]` is a call that fails once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Union

from durable_agent.compaction import digest
from durable_agent.errors import InvalidModelOutput
from durable_agent.model import ModelRequest, Reply
from durable_agent.stream import TextSink

Item = Union[Reply, BaseException, Callable[[ModelRequest], Reply]]  # noqa: UP007 - a runtime alias on 3.10


class ScriptedModel:
    provider = "scripted"

    def __init__(
        self,
        plans: Sequence[Item] = (),
        decisions: Sequence[Item] = (),
        name: str = "scripted",
        summaries: Sequence[Item] = (),
        context_window: int | None = 32_000,
    ) -> None:
        self.name = name
        self.context_window = context_window
        self._plans = list(plans)
        self._decisions = list(decisions)
        self._summaries = list(summaries)
        self.requests: list[tuple[str, ModelRequest]] = []
        self._given: dict[str, Reply] = {}

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return self._answer("plan", self._plans, request)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return self._answer("interpret", self._decisions, request)

    async def summarise(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        if self._summaries:
            return self._answer("summarise", self._summaries, request)
        self.requests.append(("summarise", request))
        return Reply(text=digest(request.question, 4_000))

    def _answer(self, kind: str, queue: list[Item], request: ModelRequest) -> Reply:
        self.requests.append((kind, request))
        key = f"{kind}:{request.model_dump_json()}"
        if key not in self._given:
            self._given[key] = _next(queue, request, kind)
        return self._given[key].model_copy(deep=True)

    def calls(self, kind: str) -> int:
        return sum(k == kind for k, _ in self.requests)


def _next(queue: list[Item], request: ModelRequest, kind: str) -> Reply:
    if not queue:
        raise InvalidModelOutput(f"scripted model has no {kind} reply left")
    item = queue.pop(0) if len(queue) > 1 else queue[0]
    if isinstance(item, BaseException):
        raise item
    if callable(item):
        return item(request)
    # A copy: the activity names calls in place, and a repeated item is reused.
    return item.model_copy(deep=True)
