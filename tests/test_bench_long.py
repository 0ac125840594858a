"""The long-turn benchmark (`python -m durable_agent.bench --long`): its reader's
decisions, its verdicts, and a small run through the command, its report's fields
checked (no timing is asserted: the machine may be busy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from durable_agent.bench import long
from durable_agent.bench.long_agent import LongReader
from durable_agent.bench.long_script import READ, WRITE, Scenario, doc, last_word
from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from durable_agent.model import ModelRequest
from durable_agent.types import ToolCall


def test_a_document_has_its_size_and_its_last_word_names_it() -> None:
    for n, chars in [(1, 2000), (1000, 20_000), (7, 30)]:
        text = doc(n, chars)
        assert len(text) <= chars and len(text) >= chars - 10
        assert last_word(text) == f"end-of-doc-{n}"
    assert doc(1, 100) != doc(2, 100)


def _conversation(reads: int, shortened: bool = False) -> list[Message]:
    messages: list[Message] = [UserMessage(text="read")]
    for n in range(1, reads + 1):
        call = ToolCall(id=f"r{n}", name=READ, arguments={"n": n})
        text = "(summed up)" if shortened and n < reads else doc(n, 200)
        messages += [
            AssistantMessage(calls=[call]),
            ToolResult(call_id=call.id, tool=READ, ok=True, text=text),
        ]
    return messages


def test_the_reader_goes_on_from_its_last_call_not_from_a_count_of_results() -> None:
    """Results shortened or summed up (as compaction may leave them) change nothing:
    the next document is the one after the last read call; a checkpoint where due;
    the answer quotes the last result's last word."""
    reader = LongReader(Scenario(steps=5, write_every=2))
    reply = reader.next(ModelRequest(messages=_conversation(0)))
    assert [c.arguments for c in reply.calls] == [{"n": 1}]
    shortened = _conversation(3, shortened=True)[:1] + _conversation(3, shortened=True)[5:]
    reply = reader.next(ModelRequest(messages=shortened))
    assert [(c.name, c.arguments) for c in reply.calls] == [(READ, {"n": 4}), (WRITE, {})]
    reply = reader.next(ModelRequest(messages=_conversation(5, shortened=True)))
    assert not reply.calls and "end-of-doc-5" in reply.text


def _result(**agent: object) -> dict[str, object]:
    base = {
        "outcome": "answered",
        "completed": True,
        "answer_uses_last_result": True,
        "history_bytes_json": 12_000_000,
        "history_bytes": 3_000_000,
        "history_events": 14_000,
        "step_ms": {"early": 50.0, "late": 70.0, "ratio": 1.4},
        "rss_mb": {"step": 100, "at_step": 100.0, "end": 120.0},
        "rss_ratio": 1.2,
        "steps_lost": [],
        "steps_repeated": [],
        "writes": {"expected": 10, "written": 10, "attempts": 11, "missing": [], "repeated": []},
    }
    return {
        "agent": {**base, **agent},
        "scenario": {"kill_every_s": 0, "early_steps": [10, 100], "late_steps": [900, 1000]},
    }


def test_every_target_has_a_verdict_and_a_miss_says_by_how_much() -> None:
    verdicts = {name: verdict for name, _, _, verdict in long.checks(_result())}
    assert verdicts["history bytes, all runs (JSON)"] == "MISS by 7,000,000 (2.40×)"
    assert verdicts["history bytes, all runs (server)"] == "PASS"
    assert verdicts["step time, median steps 900–1000 / 10–100 (ms)"] == "MISS by 0.15 (12 % over)"
    assert verdicts["worker RSS, end / step 100 (MB)"] == "PASS"
    assert verdicts["checkpoints written once (11 attempts)"] == "PASS"
    twice = _result(writes={"expected": 10, "written": 11, "attempts": 11, "repeated": [300]})
    assert (
        dict((n, v) for n, _, _, v in long.checks(twice))["checkpoints written once (11 attempts)"]
        == "MISS"
    )


def _bench(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """Run the command; its results file and what it printed."""
    out = tmp_path / "long.json"
    run = subprocess.run(
        [sys.executable, "-m", "durable_agent.bench", "--long", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


def test_a_small_long_turn_runs_through_the_command(tmp_path: Path) -> None:
    # A window small enough that the turn shortens older documents and summarises.
    r, printed = _bench(
        tmp_path,
        *("--steps", "30", "--doc-kb", "2", "--write-every", "10", "--window", "12000"),
        "--no-peers",
    )
    a = r["agent"]
    assert a["completed"] and a["outcome"] == "answered"
    assert a["answer_uses_last_result"] and "end-of-doc-30" in a["answer"]
    assert a["compactions"] >= 1 and a["model_calls"] == 31 + a["compactions"]  # summaries
    assert a["runs"] >= 1
    assert a["steps_lost"] == [] and a["steps_repeated"] == []
    assert a["writes"]["written"] == a["writes"]["expected"] == 3
    assert a["writes"]["missing"] == [] and a["writes"]["repeated"] == []
    assert 0 < a["history_events"] < 20_000 and 0 < a["history_bytes"] < a["history_bytes_json"]
    assert a["step_ms"]["early"] > 0 and a["step_ms"]["late"] > 0
    assert a["rss_mb"]["at_step"] > 0 and a["rss_mb"]["end"] > 0
    assert set(a["step_breakdown_ms"]["late"]) == {"model", "tools", "workflow_tasks", "rest"}
    assert r["plain_loop"]["answer_uses_last_result"] and r["plain_loop"]["step_ms"]["late"] > 0
    assert r["peers"] == {} and r["settings"]["payload_store"].startswith("a folder")
    assert r["scenario"] == {
        "steps": 30,
        "doc_chars": 2000,
        "write_every": 10,
        "window": 12_000,
        "kill_every_s": 0,
        "kill_at_writes": False,
        "early_steps": [1, 3],
        "late_steps": [27, 30],
    }
    # The report prints a verdict for each target.
    assert "completed" in printed and printed.count("PASS") >= 5


def test_a_worker_killed_right_after_each_write_loses_no_step_and_repeats_no_write(
    tmp_path: Path,
) -> None:
    """Each checkpoint's call runs twice (its first worker was killed before Temporal
    heard of it), and is written once."""
    r, _ = _bench(
        tmp_path, "--steps", "10", "--doc-kb", "2", "--write-every", "5", "--kill-at-writes"
    )
    a = r["agent"]
    assert a["completed"] and a["answer_uses_last_result"] and a["kills"] == 2
    assert a["steps_lost"] == [] and a["steps_repeated"] == []
    assert a["writes"] == {
        "expected": 2,
        "written": 2,
        "attempts": 4,
        "missing": [],
        "repeated": [],
    }
    assert r["peers"] == {}  # the kill variants run the agent alone


def test_a_bad_size_is_one_line(tmp_path: Path) -> None:
    """A window compaction could not keep a turn within (under twice the reply's room)
    is refused before anything starts, in one line."""
    run = subprocess.run(
        [sys.executable, "-m", "durable_agent.bench", "--long", "--window", "5000"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert run.returncode == 2 and run.stdout == ""
    [line] = run.stderr.splitlines()
    assert "--window from 10,000 to 2,000,000 tokens" in line
