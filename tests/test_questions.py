"""Customer questions through the offline model, with the real shop tools and a
real store: which calls it plans, and the facts its answer must state.

Each row runs the way a turn does (plan, the calls through the registry,
rendered results, interpret), in a chat of its own: the questions in `before`
are asked (and answered) first, and reach the model as earlier messages. The
rows are checked together and every failing row is reported, with what was
wrong, in one assertion at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage, check
from durable_agent.errors import InvalidCall, ToolError
from durable_agent.model import ModelRequest
from durable_agent.render import render_result
from durable_agent.shop import TOOLS, ShopStore
from durable_agent.shop.agent import INSTRUCTIONS
from durable_agent.shop.phrasebook import offline_model
from durable_agent.shop.questions import SEED as CASES
from durable_agent.shop.questions import Case
from durable_agent.shop.questions import problems as check_turn
from durable_agent.tools import ToolContext

_json = TypeAdapter(Any)


@dataclass(frozen=True)
class Turn:
    calls: list[str]
    answer: str


class Chat:
    """One customer's chat, driven the way the turn workflow drives a model."""

    def __init__(self, store: ShopStore, name: str) -> None:
        self.model = offline_model()
        self.store = store
        self.name = name
        self.history: list[Message] = []

    async def ask(self, question: str) -> Turn:
        messages: list[Message] = [*self.history, UserMessage(text=question)]
        reply = await self._model("plan", messages)
        calls = [c.render() for c in reply.calls]
        if reply.calls:
            messages.append(reply.message())
            messages += [self._run(i, call) for i, call in enumerate(reply.calls)]
            reply = await self._model("interpret", messages)
            if reply.calls:
                raise AssertionError(f"interpret asked for more calls: {reply.calls}")
        self.history += [UserMessage(text=question), AssistantMessage(text=reply.text)]
        return Turn(calls, reply.text)

    async def _model(self, step: str, messages: list[Message]) -> Any:
        check(messages)  # the conversation every provider would accept
        request = ModelRequest(messages=messages, tools=TOOLS.specs, instructions=INSTRUCTIONS)
        return await getattr(self.model, step)(request)

    def _run(self, index: int, call: Any) -> ToolResult:
        """Validate, call and render as parse, dispatch and parse_output do."""
        key = f"{self.name}/{len(self.history)}/{index}"
        try:
            args = TOOLS.validate(call)
            result = TOOLS[call.name](args, ToolContext("demo", self.store, key))
        except (InvalidCall, ToolError) as e:
            return ToolResult(call_id=call.id, tool=call.name, ok=False, text=str(e))
        text = render_result(_json.dump_python(result, mode="json"))
        return ToolResult(call_id=call.id, tool=call.name, ok=True, text=text)


async def run_case(case: Case, db: Path) -> Turn:
    chat = Chat(ShopStore(db), db.stem)
    for earlier in case.before:
        await chat.ask(earlier)
    return await chat.ask(case.question)


def problems(case: Case, turn: Turn) -> list[str]:
    return check_turn(case, turn.calls, turn.answer)


async def table_problems(cases: list[Case], folder: Path) -> str:
    """Every case in a chat of its own; what was wrong with each failing one, or ""."""
    failures = []
    for i, case in enumerate(cases):
        turn = await run_case(case, folder / f"chat{i}.db")
        failures += [(case.question, wrong) for wrong in problems(case, turn)]
    report = "\n".join(f"- {question!r}: {wrong}" for question, wrong in failures)
    return f"{len(failures)} problem(s) in {len(cases)} questions:\n{report}" if failures else ""


async def test_customer_questions(tmp_path: Path) -> None:
    report = await table_problems(CASES, tmp_path)
    assert not report, report


def test_the_table_is_wide() -> None:
    assert len(CASES) >= 40
    assert len({(c.before, c.question) for c in CASES}) == len(CASES)
