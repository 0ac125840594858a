"""A worker process whose agent waits for an event, for the SIGKILL test of waits.

    python -m tests.waits_worker ADDRESS TASK_QUEUE SHOP_DB

Its scripted model plans `wait_for_event("delivered", P2D)`, then answers with what the
wait's result said (`tests/test_waits.py`). Prints `ready` once it polls.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace

from temporalio.client import Client

from durable_agent.commands.worker import build_worker
from durable_agent.model import ModelCatalog, Reply
from durable_agent.runtime.codec import data_converter
from durable_agent.scripted import ScriptedModel
from durable_agent.settings import Settings
from durable_agent.shop import ShopStore
from durable_agent.shop.agent import support
from durable_agent.types import ToolCall
from tests.conftest import last_result
from tests.test_waits import WAITING_TOOLS

DELIVERED = ToolCall(
    id="e1", name="wait_for_event", arguments={"name": "delivered", "timeout": "P2D"}
)


async def main(address: str, task_queue: str, shop_db: str) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[DELIVERED])], decisions=[lambda r: Reply(text=last_result(r))]
    )
    client = await Client.connect(address, data_converter=data_converter())
    agent = replace(support, tools=WAITING_TOOLS, deps=ShopStore(shop_db))
    settings = replace(Settings.from_env(), versioning=False)
    models = ModelCatalog({"scripted": lambda _: model})
    async with build_worker(client, task_queue, agents=[agent], models=models, settings=settings):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
