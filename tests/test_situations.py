"""What customers really ask, in their own words: problems with an order (damaged,
wrong, late, missing), several orders at once, money back, what no tool can do,
other languages, typos, and listing what is theirs. Through the offline model with
the real shop tools and store, as `test_questions.py` runs its table (the store's
today is the sample data's, 2026-11-24: order 123456, due on the 21st, is late).

Each row: the calls the plan must make, the facts the answer must state, and what
it must not say.
"""

from __future__ import annotations

from pathlib import Path

from durable_agent.runtime.turns import start_turn
from durable_agent.shop.questions import HANDOFF
from durable_agent.shop.questions import SITUATIONS as CASES
from durable_agent.types import Outcome, TurnInput
from tests.conftest import Harness
from tests.test_questions import table_problems


async def test_what_customers_really_ask(tmp_path: Path) -> None:
    report = await table_problems(CASES, tmp_path)
    assert not report, report


def test_the_table_is_new_and_wide() -> None:
    from durable_agent.shop.questions import SEED as SEED_TABLE

    assert len(CASES) >= 60
    asked = {(c.before, c.question) for c in CASES}
    assert len(asked) == len(CASES)
    assert not asked & {(c.before, c.question) for c in SEED_TABLE}


async def test_where_to_turn_passes_the_output_shield(harness: Harness) -> None:
    """The address the hand-off gives comes from the agent's own instructions, which
    an answer may draw on: the output shield lets it through in a real turn."""
    async with harness.worker() as task_queue:
        turn = TurnInput(question="Can you change the delivery address on order 456789?")
        result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.outcome is Outcome.ANSWERED, result.answer
    assert HANDOFF in result.answer
