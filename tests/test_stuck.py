"""A failed test tells of the workflows its server left stuck (`tests/stuck.py`), and
the history it prints comes back whole from the test's output."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import uuid
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests import stuck


@workflow.defn(sandboxed=False)
class Broken:
    @workflow.run
    async def run(self) -> None:
        raise RuntimeError("broken on purpose")


async def test_a_stuck_workflow_is_told_with_its_history(
    env: WorkflowEnvironment,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = f"stuck-{uuid.uuid4().hex[:8]}"
    workflow_id = f"broken/{queue}"  # a slash: the file name must still be one
    async with Worker(env.client, task_queue=queue, workflows=[Broken]):
        handle = await env.client.start_workflow(Broken.run, id=workflow_id, task_queue=queue)
        async with asyncio.timeout(30):
            while EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in [
                e.event_type async for e in handle.fetch_history_events()
            ]:
                await asyncio.sleep(0.1)
    await stuck.tell(env.client)
    await handle.terminate()
    told = capsys.readouterr().out
    assert f"stuck: Broken {workflow_id} run " in told
    assert "broken on purpose" in told
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO(told))
    stuck.main()
    written = tmp_path / f"broken_{queue}.json"
    events = json.loads(written.read_text())["events"]
    assert events[0]["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED"
