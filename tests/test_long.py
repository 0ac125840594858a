"""Long-horizon turns: tool results reach the model whole (up to a per-tool limit),
and the story shows a preview of each."""

from __future__ import annotations

from pydantic import BaseModel

from durable_agent.model import Reply
from durable_agent.render import PREVIEW_CHARS, TRUNCATION_MARKER
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolContext, ToolRegistry, tool
from durable_agent.types import Outcome, ToolCall
from tests.conftest import Harness, last_result


class Page(BaseModel):
    n: int


def _page(n: int, size: int) -> str:
    """A page of `size` characters whose last word names it (no runs of spaces: the
    rendering keeps it as it is)."""
    end = f"end-of-page-{n}"
    body = ("w" * 9 + " ") * (size // 10)
    return body[: size - len(end) - 1] + "x" + end


@tool
def read_page(args: Page, ctx: ToolContext[object]) -> str:
    """A 30,000-character page."""
    return _page(args.n, 30_000)


@tool(max_result_chars=1000)
def read_summary(args: Page, ctx: ToolContext[object]) -> str:
    """A page whose tool lets the model read only its first 1,000 characters."""
    return _page(args.n, 30_000)


async def test_a_result_reaches_the_model_whole_up_to_its_tools_limit(harness: Harness) -> None:
    model = ScriptedModel(
        plans=[Reply(calls=[ToolCall(id="c1", name="read_page", arguments={"n": 1})])],
        decisions=[
            Reply(calls=[ToolCall(id="c2", name="read_summary", arguments={"n": 2})]),
            Reply(text="done"),
        ],
    )
    result = await harness.ask("read", model=model, tools=ToolRegistry([read_page, read_summary]))
    assert result.outcome is Outcome.ANSWERED
    [(_, first), (_, second)] = [r for r in model.requests if r[0] == "interpret"]
    assert last_result(first) == _page(1, 30_000)  # whole: far past the old 2,000
    cut = last_result(second)
    assert cut == _page(2, 30_000)[:1000] + TRUNCATION_MARKER.format(n=29_000)
    # The story shows the start of each result, marked as cut.
    shown = [s.observation.text for s in result.steps if s.observation is not None]
    assert [len(t) for t in shown] == [
        PREVIEW_CHARS + len(TRUNCATION_MARKER.format(n=30_000 - PREVIEW_CHARS)),
        len(cut),
    ]
