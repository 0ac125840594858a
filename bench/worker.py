"""A worker process for the benchmark and the crash tests.

    python -m durable_agent.bench.worker ADDRESS TASK_QUEUE SHOP_DB [--log FILE]
                           [--crash-after KIND --marker FILE]

It runs agent turns and the floor workflow, with the worker's settings
(AGENT_APPROVAL_*, AGENT_ENCRYPTION_KEY) as `worker.py` reads them. `--log`
appends the type of every activity it starts; `--crash-after KIND` makes it
hang right *after* the first activity of that kind has done its work (its side
effects happened, Temporal never heard of the result) and touch MARKER, so a
test can SIGKILL it there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, cast

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from durable_agent.bench.floor import FloorTurn, floor_local, floor_remote
from durable_agent.bench.models import bench_models
from durable_agent.commands.worker import build_worker
from durable_agent.runtime.codec import data_converter
from durable_agent.shop import ShopStore
from durable_agent.shop.agent import agent


class CrashAfter(Interceptor):
    def __init__(self, log: Path | None, crash_at: str | None, marker: Path | None) -> None:
        self.log, self.crash_at, self.marker = log, crash_at, marker

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _CrashAfterInbound(next, self)


class _CrashAfterInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, outer: CrashAfter) -> None:
        super().__init__(next)
        self.outer = outer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        outer = self.outer
        kind = activity.info().activity_type
        if outer.log:
            with outer.log.open("a") as f:
                f.write(kind + "\n")
        result = await super().execute_activity(input)
        if kind == outer.crash_at and outer.marker and not outer.marker.exists():
            outer.marker.touch()
            await asyncio.Event().wait()  # hang until killed
        return result


ModelCalls = Literal["activity", "local"]
MODEL_CALLS_SETTING = "BENCH_MODEL_CALLS"
"""How the benchmark's agent calls its model (`Agent.model_calls`; `--model-calls`)."""


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("task_queue")
    p.add_argument("shop_db")
    p.add_argument("--log", type=Path)
    p.add_argument("--crash-after")
    p.add_argument("--marker", type=Path)
    args = p.parse_args()

    client = await Client.connect(args.address, data_converter=data_converter())
    worker = build_worker(
        client,
        args.task_queue,
        agents=[
            replace(
                agent(),
                deps=ShopStore(args.shop_db),
                # Agent() refuses any other value in one line.
                model_calls=cast(ModelCalls, os.environ.get(MODEL_CALLS_SETTING, "activity")),
            )
        ],
        models=bench_models(),
        workflows=[FloorTurn],
        activities=[floor_remote, floor_local],
        # Only when asked: the benchmark's turns carry no instrumentation of the tests.
        interceptors=[CrashAfter(args.log, args.crash_after, args.marker)]
        if args.log or args.crash_after
        else [],
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
