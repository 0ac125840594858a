"""Version 2 of the deploy drill (`tests/test_versioning.py`): the demo shop's
worker, configured like `python worker.py` by the environment, whose turn has one
step more at the top of its loop. No turn started by the code before it can
replay on it: a deploy that lets this code take over such a turn fails it.

    python -m tests.drill_worker
"""

from __future__ import annotations

import asyncio
import signal
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from durable_agent.plugin import AgentPlugin, AgentWorker
    from durable_agent.runtime.server import connect
    from durable_agent.settings import Settings
    from durable_agent.types import TurnInput, TurnOutput
    from workflows import AgentTurn, Conversation, UnversionedConversation


@workflow.defn(name="AgentTurn")
class ChangedTurn(AgentTurn):
    @workflow.run
    async def run(self, input: TurnInput) -> TurnOutput:
        # The change: a step before the loop's first, not behind `workflow.patched`.
        await workflow.sleep(timedelta(milliseconds=1))
        return await super().run(input)


async def main() -> None:
    from shop.agent import agent

    settings = Settings.from_env()
    conn = await connect()
    plugin = AgentPlugin(agent(), settings=settings)
    plugin.workflows = [
        ChangedTurn,
        Conversation if settings.versioning else UnversionedConversation,
    ]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with AgentWorker(
        conn.client, plugin, task_queue=settings.task_queue, plugins=[plugin]
    ) as _:
        print("worker ready (version 2)", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
