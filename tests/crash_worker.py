"""A worker process for crash tests: logs every activity it runs and, when told,
hangs right *after* one activity kind has done its work (so its side effects
happened but Temporal never heard of the result), for the test to SIGKILL it.

    python -m tests.crash_worker ADDRESS TASK_QUEUE SHOP_DB LOG [CRASH_AT MARKER]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from shop import ShopStore
from worker import build_worker


class CrashAfter(Interceptor):
    def __init__(self, log: Path, crash_at: str | None, marker: Path | None) -> None:
        self.log, self.crash_at, self.marker = log, crash_at, marker

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        outer = self

        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                kind = activity.info().activity_type
                with outer.log.open("a") as f:
                    f.write(kind + "\n")
                result = await super().execute_activity(input)
                if kind == outer.crash_at and outer.marker and not outer.marker.exists():
                    outer.marker.touch()
                    await asyncio.Event().wait()  # hang until killed
                return result

        return Inbound(next)


async def main(argv: list[str]) -> None:
    address, task_queue, db, log = argv[:4]
    crash_at, marker = (argv[4], Path(argv[5])) if len(argv) > 5 else (None, None)
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    worker = build_worker(
        client,
        task_queue,
        deps=ShopStore(db),
        interceptors=[CrashAfter(Path(log), crash_at, marker)],
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
