"""The peers' long turns: each goes as far as it can within a wall-time budget.

Each peer's turn (`bench.peers.long_openai_agents`, `bench.peers.long_pydantic_ai`)
runs in a worker process of its own, set up as the peer documents it, with no
payload store: what its users get. The benchmark watches the workflow and stops at
the first of: the turn ends (answered, or ended by the server: a history over
Temporal's limits), no new history event for `STALL_S` (a workflow task failing
again and again: a payload over the 2 MB limit), or the budget. Then it reads the
history once: how many documents were read, its size, and why it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from durable_agent.bench import long_history
from durable_agent.bench.long_script import QUESTION, Scenario
from durable_agent.bench.measure import spawn, stop
from durable_agent.bench.peers import PEERS, LongPeerInput, Peer, PeerTurnOutput

STALL_S = 60.0
"""No new history event for this long: the turn is stuck (its workflow task fails)."""
POLL_S = 2.0


@dataclass(frozen=True)
class LongPeer:
    peer: Peer
    workflow: str
    tool_activity: str
    """Part of the activity type of its document reads: how far it got."""

    @property
    def name(self) -> str:
        return self.peer.name

    def is_model(self, kind: str) -> bool:
        return self.peer.model_activity in kind

    def is_read(self, kind: str) -> bool:
        return self.tool_activity in kind


_BY_NAME = {p.name: p for p in PEERS}
LONG_PEERS = (
    LongPeer(_BY_NAME["openai_agents"], "LongOpenAIAgentsTurn", "read_doc"),
    LongPeer(_BY_NAME["pydantic_ai"], "LongPydanticAITurn", "__call_tool"),
)


async def run_peer(
    client: Client, peer: LongPeer, address: str, scenario: Scenario, budget_s: float
) -> dict[str, Any]:
    """One peer's long turn, as far as it gets: documents read, history, why it stopped."""
    queue = f"bench-long-{peer.name}-{uuid.uuid4().hex[:6]}"
    worker = await asyncio.to_thread(
        spawn,
        "durable_agent.bench.peers.long_worker",
        peer.name,
        address,
        queue,
        "--steps",
        str(scenario.steps),
        "--doc-chars",
        str(scenario.doc_chars),
    )
    t0 = time.perf_counter()
    try:
        handle = await client.start_workflow(
            peer.workflow,
            LongPeerInput(question=QUESTION, steps=scenario.steps),
            id=f"long-{peer.name}-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
            result_type=PeerTurnOutput,
        )
        stopped, answer = await _watch(handle, budget_s)
    finally:
        stop(worker)
    wall = time.perf_counter() - t0
    history = await handle.fetch_history()
    reads = long_history.completed([history], peer.is_read)
    ends = long_history.step_ends([history], peer.is_model)
    times = long_history.step_times(ends)
    return {
        "stopped": stopped,
        "why": long_history.ended(history) or stopped,
        "completed": stopped == "completed",
        "answer_uses_last_result": answer is not None and scenario.expected_answer in answer,
        "steps_done": reads,
        "wall_s": round(wall, 1),
        **long_history.sizes([history]),
        "step_ms_early": long_history.median_ms(times, *scenario.early),
        "step_ms_late": long_history.median_ms(times, *scenario.late),
    }


async def _watch(handle: WorkflowHandle, budget_s: float) -> tuple[str, str | None]:
    """Until the turn ends, stalls or runs out of budget: how it stopped, and its answer
    (None when it has none). A turn still running is terminated."""
    result = asyncio.create_task(handle.result())
    t0 = time.monotonic()
    seen, since = -1, t0
    while True:
        done, _ = await asyncio.wait({result}, timeout=POLL_S)
        if done:
            try:
                return "completed", result.result().answer
            except Exception:
                return "ended", None
        now = time.monotonic()
        length = (await handle.describe()).history_length
        if length != seen:
            seen, since = length, now
        reason = ""
        if now - since > STALL_S:
            reason = f"stalled: no new history event for {STALL_S:.0f} s"
        elif now - t0 > budget_s:
            reason = f"budget: still running after {budget_s:.0f} s"
        if reason:
            result.cancel()
            with contextlib.suppress(RPCError):  # it ended meanwhile
                await handle.terminate(reason=f"benchmark: {reason}")
            return reason, None
