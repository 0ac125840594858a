"""A worker process for one peer of the benchmark.

    python -m durable_agent.bench.peers.worker PEER ADDRESS TASK_QUEUE SHOP_DB

PEER is a name from `bench.peers.PEERS`. Prints "ready" once it polls its queue, as
`bench.worker` does, then runs until it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from pathlib import Path

from durable_agent.bench.peers import PEERS
from durable_agent.bench.peers.shop import open_shop


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m durable_agent.bench.peers.worker")
    p.add_argument("peer", choices=[peer.name for peer in PEERS])
    p.add_argument("address")
    p.add_argument("task_queue")
    p.add_argument("shop_db", type=Path)
    args = p.parse_args()

    open_shop(args.shop_db)
    module = importlib.import_module(f"durable_agent.bench.peers.{args.peer}")
    worker = await module.build_worker(args.address, args.task_queue)
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
