"""What a failed test leaves behind on the session's dev server: every workflow of the
last minutes whose workflow task failed (a non-determinism error, say), with the
failure and its history, so that a run that fails once, on CI, can be replayed here.

`conftest.py` calls `tell` after each failed test that used the `env` server; the
history goes to the test's captured output (gzip, base64: decode with `python -m
tests.stuck < lines`) and to `$TMPDIR/durable-agent-stuck/`."""

from __future__ import annotations

import base64
import gzip
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

MOST = 3
"""Workflows told of per failed test."""
PRINTED = 48_000
"""The most characters of a history printed (base64 of its gzip); a longer one is only
written to the folder."""


async def tell(client: Client, since: timedelta = timedelta(minutes=10)) -> None:
    after = (datetime.now(timezone.utc) - since).strftime("%Y-%m-%dT%H:%M:%SZ")
    query = f'ExecutionStatus = "Running" AND StartTime > "{after}"'
    told = 0
    async for info in client.list_workflows(query, limit=200):
        handle = client.get_workflow_handle(info.id, run_id=info.run_id)
        history = await handle.fetch_history()
        failures = [
            e.workflow_task_failed_event_attributes.failure.message
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]
        if not failures:
            continue
        text = history.to_json()
        folder = Path(tempfile.gettempdir()) / "durable-agent-stuck"
        folder.mkdir(exist_ok=True)
        path = folder / f"{_file_name(info.id)}.{info.run_id}.json"
        path.write_text(text)
        packed = base64.b64encode(gzip.compress(text.encode())).decode()
        print(f"stuck: {info.workflow_type} {info.id} run {info.run_id}: {failures[0]}")
        print(f"stuck: history written to {path}")
        if len(packed) <= PRINTED:
            print(f"stuck-history {info.id} {packed}")
        told += 1
        if told == MOST:
            return


def _file_name(workflow_id: str) -> str:
    """A workflow id as a file name of this folder (an id may hold any character)."""
    return "".join(c if c.isalnum() or c in "-_.%:" else "_" for c in workflow_id)[:200]


def main() -> None:
    """Each `stuck-history <id> <data>` line of standard input, as `<id>.json`."""
    for line in sys.stdin:
        if line.startswith("stuck-history "):
            try:
                _, workflow_id, packed = line.split()
                data = gzip.decompress(base64.b64decode(packed, validate=True))
            except (ValueError, OSError, EOFError) as e:  # a line cut or altered
                print(f"skipped a stuck-history line that is not whole: {e}", file=sys.stderr)
                continue
            path = Path(f"{_file_name(workflow_id)}.json")
            path.write_bytes(data)
            print(path)


if __name__ == "__main__":
    main()
