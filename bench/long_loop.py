"""The long turn in a plain Python loop: the same model and tool functions, no
Temporal. What a step costs with nothing durable around it, for comparison."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from durable_agent.bench.long_agent import Library, LongReader, read_doc, save_checkpoint
from durable_agent.bench.long_script import QUESTION, Scenario
from durable_agent.conversation import Message, ToolResult, UserMessage
from durable_agent.model import ModelRequest
from durable_agent.tools import ToolContext

TOOLS = {t.name: t for t in (read_doc, save_checkpoint)}


def plain_loop(scenario: Scenario, effects: Path) -> tuple[str, list[float]]:
    """Run the scenario; its answer and the seconds each step took (a step: the model's
    reply, then its calls)."""
    library = Library(scenario.doc_chars, effects)
    model = LongReader(scenario)
    messages: list[Message] = [UserMessage(text=QUESTION)]
    times: list[float] = []
    try:
        t0 = time.perf_counter()
        while True:
            # As a caller holding the conversation passes it: no copy, no validation.
            reply = model.next(ModelRequest.model_construct(messages=messages))
            if not reply.calls:
                return reply.text, times
            messages.append(reply.message())
            for at, call in enumerate(reply.calls):
                messages.append(
                    _run(call.name, call.arguments, library, len(times) + 1, at, call.id)
                )
            now = time.perf_counter()
            times.append(now - t0)
            t0 = now
    finally:
        library.close()


def _run(
    name: str, arguments: dict[str, Any], library: Library, step: int, at: int, call_id: str
) -> ToolResult:
    tool = TOOLS[name]
    assert tool.args_model is not None
    args = tool.args_model.model_validate(arguments)
    ctx = ToolContext(customer_id="bench", deps=library, idempotency_key=f"loop/{step}/{at}")
    return ToolResult(call_id=call_id, tool=name, ok=True, text=str(tool.fn(args, ctx)))
