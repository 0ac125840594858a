"""The processes a test starts: their environment, and what Linux's /proc lists."""

from __future__ import annotations

import os
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from durable_agent.settings import state_dir


def children(parent: int, name: str) -> list[int]:
    """The pids of `parent`'s children whose command line has `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        if f"\nPPid:\t{parent}\n" in status and name in cmdline:
            found.append(int(entry.name))
    return found


def worker_env(env: WorkflowEnvironment, tmp_path: Path, **more: str) -> dict[str, str]:
    """A worker process of its own state folder that stores its payloads where this
    process stores and reads them: a run this process drives reads its results."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))},
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
        "AGENT_STATE_DIR": str(tmp_path / "state"),
        "AGENT_PAYLOAD_STORE": f"local:{state_dir() / 'payloads'}",
        **more,
    }
