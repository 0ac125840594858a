"""A worker process for one peer's long turn.

    python -m durable_agent.bench.peers.long_worker PEER ADDRESS TASK_QUEUE
                    [--steps N] [--doc-chars N]

PEER is a name from `bench.peers.long_peers.LONG_PEERS`. Prints "ready" once it polls
its queue, as `bench.peers.worker` does, then runs until it is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib

from durable_agent.bench.long_script import Scenario
from durable_agent.bench.peers.long_peers import LONG_PEERS


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m durable_agent.bench.peers.long_worker")
    p.add_argument("peer", choices=[peer.name for peer in LONG_PEERS])
    p.add_argument("address")
    p.add_argument("task_queue")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--doc-chars", type=int, default=20_000)
    args = p.parse_args()

    scenario = Scenario(steps=args.steps, doc_chars=args.doc_chars, write_every=0)
    module = importlib.import_module(f"durable_agent.bench.peers.long_{args.peer}")
    worker = await module.build_worker(args.address, args.task_queue, scenario)
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
