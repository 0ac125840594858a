"""A worker process for the trace tests: `worker.py`'s worker, tracing per the OTEL_*
variables, that hangs at the start of its first `interpret` and touches MARKER, so
a test can SIGKILL it mid-turn with every earlier activity done and exported.

    python -m tests.traced_worker ADDRESS TASK_QUEUE SHOP_DB MARKER
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from durable_agent.commands.worker import build_worker
from durable_agent.runtime.server import open_client
from durable_agent.shop import ShopStore
from durable_agent.shop.agent import support


class HangAtStart(Interceptor):
    """Inside the tracing plugin's interceptor: the attempt's span is open and nothing
    of the activity has run."""

    def __init__(self, kind: str, marker: Path) -> None:
        self.kind, self.marker = kind, marker

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        outer = self

        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                if activity.info().activity_type == outer.kind and not outer.marker.exists():
                    outer.marker.touch()
                    await asyncio.Event().wait()  # until killed
                return await super().execute_activity(input)

        return Inbound(next)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("task_queue")
    p.add_argument("shop_db")
    p.add_argument("marker", type=Path)
    args = p.parse_args()
    client = await open_client({"target_host": args.address})
    hang = HangAtStart("interpret", args.marker)
    shop = replace(support, deps=ShopStore(args.shop_db))
    async with build_worker(client, args.task_queue, agents=[shop], interceptors=[hang]):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
