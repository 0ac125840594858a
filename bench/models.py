"""A model for measuring multi-iteration turns: the offline model, told to go on."""

from __future__ import annotations

from agent.model import Decision, ModelCatalog, ModelRequest, Plan
from agent.offline import OfflineModel


class RepeatingModel:
    """Plans like the offline model, then continues until `iterations` are done."""

    system = "offline"

    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.name = f"repeat-{iterations}"
        self._offline = OfflineModel()

    async def plan(self, request: ModelRequest) -> Plan:
        return await self._offline.plan(request)

    async def interpret(self, request: ModelRequest) -> Decision:
        done = request.steps[-1].iteration if request.steps else 1
        if done < self.iterations:
            return Decision(final=False, text=request.question)
        return await self._offline.interpret(request)


def bench_models() -> ModelCatalog:
    """`offline`, and `repeat:N` for turns of N iterations."""
    return ModelCatalog(
        {"offline": lambda _: OfflineModel(), "repeat": lambda n: RepeatingModel(int(n or 1))}
    )
