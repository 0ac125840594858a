"""Version 2 of the deploy drill (`tests/test_versioning.py`): the demo shop's
worker, configured like `python worker.py` by the environment, whose turn and
conversation each take one step more, before their loop starts (a 1 ms timer, not
behind `workflow.patched`). No turn or conversation run started by the code before
it can replay on it: a deploy that lets this code take over such a run fails it.

    python -m tests.drill_worker
"""

import asyncio
import signal
from datetime import timedelta

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from durable_agent.chat import ConversationInput, ConversationOutput
    from durable_agent.plugin import AgentPlugin, AgentWorker
    from durable_agent.runtime.server import connect
    from durable_agent.settings import Settings
    from durable_agent.types import TurnInput, TurnOutput
    from durable_agent.workflows import AgentTurn, Conversation, UnversionedConversation

CHANGE = timedelta(milliseconds=1)


@workflow.defn(name="AgentTurn")
class ChangedTurn(AgentTurn):
    @workflow.run
    async def run(self, input: TurnInput) -> TurnOutput:
        await workflow.sleep(CHANGE)  # the change
        return await super().run(input)


@workflow.defn(name="Conversation", versioning_behavior=VersioningBehavior.PINNED)
class ChangedConversation(Conversation):
    @workflow.run
    async def run(self, input: ConversationInput) -> ConversationOutput:
        await workflow.sleep(CHANGE)  # the change
        return await super().run(input)


@workflow.defn(name="Conversation")
class UnversionedChangedConversation(UnversionedConversation):
    @workflow.run
    async def run(self, input: ConversationInput) -> ConversationOutput:
        await workflow.sleep(CHANGE)  # the change
        return await super().run(input)


async def main() -> None:
    from durable_agent.shop.agent import agent

    settings = Settings.from_env()
    conn = await connect()
    plugin = AgentPlugin(agent(), settings=settings)
    plugin.workflows = [
        ChangedTurn,
        ChangedConversation if settings.versioning else UnversionedChangedConversation,
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
