"""The demo's sample questions as an eval suite of durable turns (`python -m durable_agent.evals
questions`): conversations with earlier questions, writes approved as the customer,
each case on a fresh copy of the sample data."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from durable_agent.evals.questions import run_questions, summary
from durable_agent.shop import questions

ROOT = Path(__file__).resolve().parent.parent
RETURN = "I want to return order 123456, the soap is broken"


async def test_cases_run_as_durable_conversations(env: WorkflowEnvironment, tmp_path: Path):
    started = [c for c in questions.SEED if c.question == RETURN and not c.before]
    again = [c for c in questions.SEED if c.before == (RETURN,)]
    follow_up = [c for c in questions.SEED if len(c.before) == 2]
    table = [*started, *again, *follow_up[:1], *questions.SITUATIONS[:3]]
    assert len(table) == 6
    out = io.StringIO()
    reports = await run_questions(env.client, table, model="offline", state_dir=tmp_path, out=out)
    failed = [(r.question, r.problems) for r in reports if not r.passed]
    assert not failed, failed
    # The same return is started in two cases: each on the sample data, each rtn005.
    assert "I've started return rtn005" in reports[0].answer
    assert "already has an open return, rtn005" in reports[1].answer
    assert reports[2].turns == 3 and reports[0].model_calls == 2
    assert summary(reports)["passed"] == 6
    assert out.getvalue().count("pass ") == 6


def test_a_model_the_worker_lacks_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "durable_agent.evals", "questions", "--model", "gpt5"],
        cwd=ROOT,
        env={**os.environ, "AGENT_STATE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == "error: --model 'gpt5': use one of anthropic, bedrock, offline, openai, sagemaker"
    )
