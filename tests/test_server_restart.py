"""Restart the embedded dev server (SQLite file) in the middle of a turn: the
turn resumes from the file and completes."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from durable_agent.model import Reply
from durable_agent.runtime.codec import LEAN_DATA_CONVERTER
from durable_agent.runtime.server import EmbeddedServer, free_port
from durable_agent.runtime.turns import start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.shop import ShopStore
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, ToolCall, TurnInput
from tests.conftest import Harness, connect_when_ready, last_result


class Nothing(BaseModel):
    pass


async def test_turn_survives_a_server_restart(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()

    @tool(timeout=timedelta(seconds=60))
    def gate(args: Nothing, ctx: ToolContext[object]) -> str:
        """Waits until the test lets it through."""
        entered.set()
        release.wait(60)
        return "through the gate"

    server = EmbeddedServer(tmp_path / "temporal.db", port=free_port(), ui_port=free_port())
    server.start()
    try:
        client = await connect_when_ready(server.address, data_converter=LEAN_DATA_CONVERTER)
        model = ScriptedModel(
            plans=[Reply(calls=[ToolCall(id="c1", name="gate")])],
            decisions=[lambda req: Reply(text=last_result(req))],
        )
        harness = Harness(client, ShopStore(tmp_path / "shop.db"))
        async with harness.worker(model, ToolRegistry([gate])) as task_queue:
            handle = await start_turn(
                client, TurnInput(question="go", model="scripted"), task_queue
            )
            await asyncio.to_thread(entered.wait, 30)

            server.stop()
            server.start()
            release.set()

            result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        release.set()
        server.stop()

    assert result.outcome is Outcome.ANSWERED
    assert result.answer == "through the gate"
