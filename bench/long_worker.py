"""A worker process for the long turn (`bench.long_agent`), as a team serves its agent:
a client with `AgentPlugin`, a worker from `build_worker`.

    python -m durable_agent.bench.long_worker ADDRESS TASK_QUEUE EFFECTS_DB [--doc-chars N]
                    [--hang-after-write MARKER]

Its payload store is the one AGENT_PAYLOAD_STORE names, as for any worker. Prints
"ready" once it polls its queue (`bench.measure.spawn`), then runs until stopped.
`--hang-after-write`: right after a checkpoint is first written, touch MARKER and hang
until killed (`bench.long_agent.Library`).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from temporalio.client import Client

from durable_agent import AgentPlugin, build_worker
from durable_agent.bench.long_agent import long_agent


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m durable_agent.bench.long_worker")
    p.add_argument("address")
    p.add_argument("task_queue")
    p.add_argument("effects", type=Path)
    p.add_argument("--doc-chars", type=int, default=20_000)
    p.add_argument("--hang-after-write", type=Path)
    args = p.parse_args()

    agent = long_agent(args.doc_chars, args.effects, args.hang_after_write)
    client = await Client.connect(args.address, plugins=[AgentPlugin(agent)])
    async with build_worker(client, task_queue=args.task_queue):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
