"""`python -m durable_agent.evals questions --model SPEC`: the demo shop's sample questions as an
eval suite of durable turns.

Every case of `shop/questions.py` (`--table seed|situations|all`) is a conversation
with the shop's agent on a worker of this process: its earlier questions first, then
the question, each a turn answered by `--model`. The cases run one after the other,
each on a fresh copy of the sample data (a return one case starts is not in the
next one's answers), and writes are approved as the customer would. A case passes when the first
plan of its last turn made the expected calls and the answer states the expected
facts (the facts are the offline model's words: with another model, `calls_ok` is
the column to read).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from temporalio.client import Client

from durable_agent.chat import ConversationInput
from durable_agent.client import AgentClient
from durable_agent.evals.run import approved_as_customer
from durable_agent.settings import Settings
from durable_agent.shop import questions
from durable_agent.shop.agent import support
from durable_agent.shop.store import ShopStore
from durable_agent.types import StepKind

TABLES = {"seed": questions.SEED, "situations": questions.SITUATIONS, "all": questions.ALL}


@dataclass
class CaseReport:
    case: int
    question: str
    passed: bool
    calls_ok: bool
    facts_ok: bool
    problems: str
    calls: str
    answer: str
    turns: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    seconds: float
    history_events: int
    workflow_id: str


SAMPLE = "demo"
"""The sample data's customer: every case is a conversation of theirs."""


async def run_questions(
    client: Client,
    table: list[questions.Case],
    *,
    model: str,
    state_dir: Path,
    out: TextIO = sys.stdout,
) -> list[CaseReport]:
    """Every case of `table` as a conversation, one after the other, each on a fresh
    copy of the sample data."""
    from durable_agent.commands.worker import build_worker

    run = f"questions-{uuid.uuid4().hex[:8]}"
    folder = state_dir / run
    folder.mkdir(parents=True, exist_ok=True)
    pristine, live = folder / "sample.db", folder / "shop.db"
    ShopStore(pristine)
    store = ShopStore(live)
    agent = replace(support, deps=store)
    settings = replace(Settings.from_env(), versioning=False, task_queue=run)
    reports: list[CaseReport] = []
    async with build_worker(client, run, agents=[agent], settings=settings):
        for n, case in enumerate(table):
            shutil.copyfile(pristine, live)  # the sample data, as the case expects it
            report = await _case(client, n, case, model, run)
            reports.append(report)
            mark = "pass" if report.passed else "FAIL"
            print(f"[{n + 1:>3}/{len(table)}] {mark}  {case.question[:70]}", file=out, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return reports


async def _case(client: Client, n: int, case: questions.Case, model: str, run: str) -> CaseReport:
    started = time.monotonic()
    chat = ConversationInput(customer_id=SAMPLE, agent=support.name, model=model)
    said = [*case.before, case.question]
    conversation = AgentClient(client, task_queue=run).chat_from(chat)
    turn = await conversation.start(said[0])
    output = await approved_as_customer(turn)
    usage = [output.usage]
    for text in said[1:]:
        turn = await conversation.start(text)
        output = await approved_as_customer(turn)
        usage.append(output.usage)
    with contextlib.suppress(Exception):
        await conversation.end()
    plan = next((s for s in output.steps if s.kind is StepKind.PLAN), None)
    calls = [c.render() for c in plan.calls] if plan else []
    wrong = questions.problems(case, calls, output.answer)
    calls_ok = calls == case.calls
    history = await turn.temporal.fetch_history()
    return CaseReport(
        case=n,
        question=case.question,
        passed=not wrong,
        calls_ok=calls_ok,
        facts_ok=not [w for w in wrong if not w.startswith("calls ")],
        problems="; ".join(wrong),
        calls=", ".join(calls),
        answer=output.answer,
        turns=len(said),
        model_calls=sum(u.model_calls for u in usage),
        input_tokens=sum(u.input_tokens for u in usage),
        output_tokens=sum(u.output_tokens for u in usage),
        seconds=round(time.monotonic() - started, 2),
        history_events=len(history.events),
        workflow_id=turn.id,
    )


def summary(reports: list[CaseReport]) -> dict[str, Any]:
    return {
        "cases": len(reports),
        "passed": sum(r.passed for r in reports),
        "calls_ok": sum(r.calls_ok for r in reports),
        "facts_ok": sum(r.facts_ok for r in reports),
        "model_calls": sum(r.model_calls for r in reports),
        "input_tokens": sum(r.input_tokens for r in reports),
        "output_tokens": sum(r.output_tokens for r in reports),
        "longest_history_events": max((r.history_events for r in reports), default=0),
    }


def rows(reports: list[CaseReport]) -> list[dict[str, Any]]:
    return [asdict(r) for r in sorted(reports, key=lambda r: r.case)]
