"""The processes a test starts: their environment, and what Linux's /proc lists."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import tempfile
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


class Forks:
    """Commands run as `subprocess.run` runs them, each in a process forked from one that
    imported the command's modules once (tests/fork_server.py): for the many short runs
    of a command (bad input, one line each), whose time is mostly the imports."""

    def __init__(self, modules: list[str], env: dict[str, str], cwd: Path) -> None:
        self.cwd = cwd
        self.server = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fork_server.py")), *modules],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._read(4)  # ready: the modules are imported

    def _read(self, n: int) -> bytes:
        assert self.server.stdout is not None
        data = self.server.stdout.read(n)
        assert len(data) == n, f"the fork server ended (exit code {self.server.wait()})"
        return data

    def run(
        self,
        args: list[str],
        env: dict[str, str],
        timeout: float = 30,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`python ARGS` (`-m MODULE ...` too) in `env`, from `cwd` (else the server's
        folder), with no standard input: its exit code, standard output and error."""
        assert self.server.stdin is not None
        with tempfile.TemporaryDirectory(prefix="forked-") as folder:
            out, err = Path(folder, "out"), Path(folder, "err")
            request = pickle.dumps(
                {
                    "args": args,
                    "env": env,
                    "cwd": str(cwd or self.cwd),
                    "out": str(out),
                    "err": str(err),
                    "timeout": timeout,
                }
            )
            self.server.stdin.write(struct.pack("!I", len(request)) + request)
            self.server.stdin.flush()
            (code,) = struct.unpack("!i", self._read(4))
            return subprocess.CompletedProcess(
                [sys.executable, *args],
                code,
                out.read_text(errors="surrogateescape"),
                err.read_text(errors="surrogateescape"),
            )

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(timeout=30)
