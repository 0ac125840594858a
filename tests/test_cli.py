"""The commands a user runs, as subprocesses on a machine with nothing running:
`client.py demo` alone, and `worker.py` + `client.py ask --follow` side by side."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.server import free_port
from tests.conftest import SEED_CASES

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A machine with no server: embedded server on free ports, state in tmp_path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    env.update(
        AGENT_STATE_DIR=str(tmp_path / "state"),
        AGENT_SHOP_DB=str(tmp_path / "shop.db"),
        AGENT_SERVER_PORT=str(free_port()),
        AGENT_UI_PORT=str(free_port()),
        AGENT_TASK_QUEUE="cli-test",
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such-temporal.toml"),
        PYTHONUNBUFFERED="1",
    )
    return env


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_demo_runs_the_six_cases_with_nothing_running(cli_env: dict[str, str]) -> None:
    out = run(["client.py", "demo"], cli_env)
    assert out.returncode == 0, out.stderr
    for question, expected in SEED_CASES:
        assert f"Q: {question}\nA: " in out.stdout
        answer = out.stdout.split(f"Q: {question}\nA: ")[1].split("\n")[0]
        assert expected in answer
    assert f"http://localhost:{cli_env['AGENT_UI_PORT']}/namespaces/default/workflows" in out.stdout
    assert Path(cli_env["AGENT_STATE_DIR"], "temporal.db").exists()


@pytest.fixture
def worker(cli_env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the worker is ready (or dies)
    assert "worker ready" in line, line + proc.stdout.read()
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_worker_and_ask_follow_in_two_processes(
    cli_env: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    out = run(["client.py", "ask", "Has order 123456 shipped?", "--follow"], cli_env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[1] plan        order_status(order_id='123456')"
    assert lines[1] == "[1] tool_call   order_status(order_id='123456')"
    assert lines[2].startswith("[1] observation order_status: Order id: 123456. Item: Herbal")
    assert lines[3].startswith("[1] answer")
    assert "answer (answered): Order id: 123456" in out.stdout
    workflow_id = next(line.split()[1] for line in lines if line.startswith("workflow: "))
    assert workflow_id.startswith("turn-demo-")
    assert f"/namespaces/default/workflows/{workflow_id}/" in out.stdout

    shown = run(["client.py", "show", workflow_id], cli_env)
    assert shown.returncode == 0, shown.stderr
    assert "(completed)" in shown.stdout and "Herbal Handsoap" in shown.stdout

    missing = run(["client.py", "show", "turn-demo-nope"], cli_env)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "error: no turn with workflow id 'turn-demo-nope'"

    # SIGTERM: graceful shutdown, and the embedded server stops with the worker.
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    port = int(cli_env["AGENT_SERVER_PORT"])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_huge_question_from_stdin_is_refused(cli_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "client.py", "ask", "-"],
        cwd=ROOT,
        env=cli_env,
        input="why " * 262_144,  # 1 MiB
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: the question is too long (1048575 characters; at most 4000)"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ask", "   "], "error: the question is empty"),
        (["ask", "Has order \udcff123456 shipped?"], "error: the question is not valid UTF-8"),
        (["ask", "hi", "--customer", "x/../y"], "error: customer id must be"),
        (["ask", "Has order 123456 shipped?"], "error: no Temporal server on localhost"),
        (["show", "turn-demo-nope"], "error: no Temporal server on localhost"),
    ],
)
def test_bad_input_gets_one_clear_line(
    cli_env: dict[str, str], args: list[str], message: str
) -> None:
    out = run(["client.py", *args], cli_env, timeout=30)
    assert out.returncode == 1
    assert out.stderr.strip().startswith(message), out.stderr
    assert "Traceback" not in out.stderr
