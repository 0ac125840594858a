"""Log lines that name the turn: workflow id, run id, activity type and attempt, and the
trace id, in JSON for machines and in readable text by default."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from temporalio import activity
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from durable_agent.runtime.logs import (
    JsonFormatter,
    TextFormatter,
    TurnFields,
    guard_sdk_messages,
)
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput
from tests.fakes.otlp import OtlpReceiver

ROOT = Path(__file__).resolve().parent.parent
ACTIVITY = {
    "activity_id": "3",
    "activity_type": "dispatch",
    "attempt": 2,
    "namespace": "default",
    "task_queue": "agent-turns",
    "workflow_id": "turn-demo-1234abcd",
    "workflow_run_id": "0192-run",
    "workflow_type": "AgentTurn",
}


def record(**extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "temporalio.activity", logging.WARNING, __file__, 1, "it broke", (), None
    )
    rec.__dict__.update(extra)
    return rec


def test_a_line_logged_in_an_activity_carries_its_turn_and_trace() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("RunActivity:dispatch") as span:
        rec = record(temporal_activity=ACTIVITY)
        assert TurnFields().filter(rec)
    trace_id = f"{span.get_span_context().trace_id:032x}"

    line = json.loads(JsonFormatter().format(rec))
    assert line["message"] == "it broke" and line["level"] == "WARNING"
    assert line["workflow_id"] == "turn-demo-1234abcd" and line["run_id"] == "0192-run"
    assert (line["activity_type"], line["attempt"]) == ("dispatch", 2)
    assert line["trace_id"] == trace_id

    text = TextFormatter().format(rec)
    assert text.endswith(f"it broke [turn-demo-1234abcd dispatch#2 trace={trace_id}]")


def test_a_line_outside_any_turn_stays_plain() -> None:
    rec = record()
    TurnFields().filter(rec)
    assert "workflow_id" not in json.loads(JsonFormatter().format(rec))
    assert TextFormatter().format(rec).endswith("temporalio.activity: it broke")


def test_a_line_never_shows_a_credential_not_even_in_its_traceback() -> None:
    """Whatever logged it (an SDK, a tool's own logger), the worker's log masks keys."""
    key = "sk-proj-Zx81Lm0Qp7Rt4Vw2Yb9Nc3Kd6Fg5Hj1Aa"
    try:
        raise ConnectionError(f"refused: Authorization: Bearer {key}")
    except ConnectionError:
        exc_info = sys.exc_info()
    rec = logging.LogRecord(
        "tools", logging.WARNING, __file__, 1, "sent %s", (f"api_key={key}",), exc_info
    )
    line = json.loads(JsonFormatter().format(rec))
    assert line["message"] == "sent api_key=***"
    assert "ConnectionError: refused: Authorization: ***" in line["exception"]
    text = TextFormatter().format(rec)
    assert "sent api_key=***" in text and "Authorization: ***" in text
    assert key not in json.dumps(line) + text


async def test_a_turns_lines_from_the_worker_carry_its_ids_and_trace(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    task_queue = f"logs-{uuid.uuid4().hex[:8]}"
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_", "OTEL_"))
    }
    with OtlpReceiver() as otlp:
        proc = subprocess.Popen(
            [sys.executable, "worker.py", "--log-format", "json", "--log-level", "info"],
            cwd=ROOT,
            env=base
            | {
                "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
                "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
                "AGENT_TASK_QUEUE": task_queue,
                "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and "worker ready" in proc.stdout.readline()
            turn = TurnInput(question="Has order 123456 shipped?")
            handle = await start_turn(env.client, turn, task_queue)
            assert (await handle.result()).outcome is Outcome.ANSWERED
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        spans = otlp.spans()

    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert len(lines) == len(err.splitlines()), err  # every line is JSON
    mine = [line for line in lines if line.get("workflow_id") == handle.id]
    kinds = [line.get("activity_type") for line in mine]
    assert kinds == ["plan", "dispatch", "interpret", None], mine  # None: the workflow's line
    assert mine[-1]["message"].startswith("turn answered: 2 model call(s)")
    (run,) = {s.trace_id for s in spans if s.attributes.get("temporalWorkflowID") == handle.id}
    for line in mine:
        assert line["run_id"] == handle.result_run_id
        assert line["trace_id"] == run, line
        assert re.fullmatch(r"[0-9a-f]{32}", line["trace_id"])
    assert all(line["attempt"] == 1 for line in mine[:3])
    for words in ("order_id=", "Herbal Handsoap", "shipped?"):  # no customer words in logs
        assert words not in err


async def test_a_tenant_users_turn_id_with_its_percent_never_breaks_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SDK appends the turn's ids to a message before formatting it with its
    arguments: `turn-acme%3Aada-…` then broke the line (pytest's handler raises on
    that, so the activity failed). The guard the plugin installs formats it first."""

    @activity.defn
    async def noisy() -> None:
        activity.logger.warning("call %s failed: %s", "c1", "boom")

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id="turn-acme%3Aada-1f2e3d4c")
    guard_sdk_messages()
    with caplog.at_level(logging.WARNING, logger="temporalio.activity"):
        await env.run(noisy)
    [line] = [r.getMessage() for r in caplog.records if r.name == "temporalio.activity"]
    assert line.startswith("call c1 failed: boom ({") and "turn-acme%3Aada-1f2e3d4c" in line
