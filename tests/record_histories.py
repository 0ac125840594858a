"""Record the histories that `test_replay.py` replays.

    python -m tests.record_histories

Run it when a change to the workflow is *meant* to change its commands, and
commit the new files together with a versioning plan (`workflow.patched`) for
turns already running. Until then, the stored histories prove that the
workflow code still makes the same decisions from the same history.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from agent.model import Decision, Plan
from agent.scripted import ScriptedModel
from agent.types import ToolCall, TurnInput, TurnLimits
from client import start_turn
from runtime.server import DEV_SERVER_TUNING, temporal_cli
from shop import ShopStore
from tests.conftest import Harness

HISTORIES = Path(__file__).parent / "histories"


def _order(order_id: str) -> ToolCall:
    return ToolCall(id="c1", name="order_status", arguments={"order_id": order_id})


def scenarios() -> dict[str, tuple[TurnInput, ScriptedModel | None]]:
    continuing = ScriptedModel(
        plans=[Plan(calls=[_order("123456")])],
        decisions=[Decision(final=False, text="check again")],
    )
    replanning = ScriptedModel(
        plans=[Plan(calls=[_order("12ab")]), Plan(calls=[_order("123456")])],
        decisions=[Decision(final=True, text="It shipped.")],
    )
    return {
        "order_answered": (TurnInput(question="Which item was ordered for 123456?"), None),
        "declined": (TurnInput(question="How is the weather in Scotland right now?"), None),
        "start_return": (
            TurnInput(question="I want to return order 123456, it arrived damaged."),
            None,
        ),
        "not_found": (TurnInput(question="When is my return rtn123 processed?"), None),
        "two_calls": (
            TurnInput(question="Has order 123456 shipped and is return rtn001 processed?"),
            None,
        ),
        "replanned": (
            TurnInput(question="Has order 12ab shipped?", model="scripted"),
            replanning,
        ),
        "step_limit": (
            TurnInput(
                question="Has order 123456 shipped?",
                model="scripted",
                limits=TurnLimits(max_steps=2),
            ),
            continuing,
        ),
    }


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=DEV_SERVER_TUNING,
        data_converter=pydantic_data_converter,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            harness = Harness(env.client, ShopStore(Path(tmp) / "shop.db"))
            for name, (turn, model) in scenarios().items():
                async with harness.worker(model) as task_queue:
                    handle = await start_turn(env.client, turn, task_queue)
                    await handle.result()
                history = await handle.fetch_history()
                (HISTORIES / f"{name}.json").write_text(history.to_json())
                print(f"recorded {name}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
