"""The floor: a no-op workflow with the activity shape of an agent turn.

One plan, then per iteration (round of tools) parse, dispatch, parse_output and
interpret; plan, dispatch and interpret are regular activities, parse and
parse_output local ones. Whatever a turn costs above this is the agent's own
overhead.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow

REMOTE = timedelta(seconds=60)
LOCAL = timedelta(seconds=5)


class FloorInput(BaseModel):
    iterations: int = 1


class FloorOutput(BaseModel):
    iterations: int


class Nop(BaseModel):
    step: str


@activity.defn(name="floor_remote")
async def floor_remote(x: Nop) -> Nop:
    return x


@activity.defn(name="floor_local")
async def floor_local(x: Nop) -> Nop:
    return x


@workflow.defn(name="FloorTurn")
class FloorTurn:
    @workflow.run
    async def run(self, input: FloorInput) -> FloorOutput:
        await workflow.execute_activity(
            floor_remote, Nop(step="plan"), start_to_close_timeout=REMOTE
        )
        for _ in range(input.iterations):
            await workflow.execute_local_activity(
                floor_local, Nop(step="parse"), start_to_close_timeout=LOCAL
            )
            await workflow.execute_activity(
                floor_remote, Nop(step="dispatch"), start_to_close_timeout=REMOTE
            )
            await workflow.execute_local_activity(
                floor_local, Nop(step="parse_output"), start_to_close_timeout=LOCAL
            )
            await workflow.execute_activity(
                floor_remote, Nop(step="interpret"), start_to_close_timeout=REMOTE
            )
        return FloorOutput(iterations=input.iterations)
