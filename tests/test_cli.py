"""The commands a user runs, as subprocesses on a machine with nothing running:
`client.py demo` alone, and `worker.py` + `client.py ask --follow` side by side."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import ListWorkersRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_agent import AgentClient
from durable_agent.plugin import AgentPlugin
from durable_agent.runtime.server import free_port
from durable_agent.runtime.streams import QUERY_WAIT
from durable_agent.runtime.turns import workers
from durable_agent.shop import ShopStore
from tests.conftest import SEED_CASES, Harness
from tests.procs import Forks

ROOT = Path(__file__).resolve().parent.parent
CODEC_SERVER = "durable_agent.runtime.codec_server"


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A machine with no server: embedded server on free ports, state in tmp_path."""
    return machine(tmp_path)


@pytest.fixture(scope="module")
def forks_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """`cli_env` for the module's bad-input runs, its ports picked once: the command
    reads them as it loads, so the runs fork from one process (`cli_forks`)."""
    return machine(tmp_path_factory.mktemp("refused"))


def machine(folder: Path) -> dict[str, str]:
    """The environment of a machine with no server, its state in `folder`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    env.update(
        AGENT_STATE_DIR=str(folder / "state"),
        AGENT_SHOP_DB=str(folder / "shop.db"),
        AGENT_SERVER_PORT=str(free_port()),
        AGENT_UI_PORT=str(free_port()),
        AGENT_TASK_QUEUE="cli-test",
        TEMPORAL_CONFIG_FILE=str(folder / "no-such-temporal.toml"),
        PYTHONUNBUFFERED="1",
        # Every payload in the state folder's store: `ask` and `show` read references.
        AGENT_PAYLOAD_STORE="local",
        AGENT_PAYLOAD_THRESHOLD="0",
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


def test_demo_runs_the_six_cases_with_nothing_running(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The installed command, in a folder of one's own: what it keeps (the embedded
    server's file, the shop's data) is in that folder's .durable-agent/."""
    here = tmp_path / "project"
    here.mkdir()
    env = {k: v for k, v in cli_env.items() if k not in ("AGENT_STATE_DIR", "AGENT_SHOP_DB")}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "durable-agent"), "demo"],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (here / ".durable-agent").glob("*.db")) == [
        "shop.db",
        "temporal.db",
    ]
    for question, expected in SEED_CASES:
        assert f"Q: {question}\nA: " in out.stdout
        answer = out.stdout.split(f"Q: {question}\nA: ")[1].split("\n")[0]
        assert expected in answer
    assert f"http://localhost:{cli_env['AGENT_UI_PORT']}/namespaces/default/workflows" in out.stdout


def started_worker(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=env,
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


@pytest.fixture
def worker(cli_env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A worker process that embeds a server of its own (for the tests of that server)."""
    yield from started_worker(cli_env)


@pytest.fixture
def served(shared_server: dict[str, str]) -> Iterator[dict[str, str]]:
    """A worker process on the session's dev server, its task queue its own: the
    environment the test's commands run in. No server to start (5-6 s a test)."""
    for _ in started_worker(shared_server):
        yield shared_server


def test_worker_and_ask_follow_in_two_processes(served: dict[str, str]) -> None:
    cli_env = served
    out = run(["client.py", "ask", "Has order 123456 shipped?", "--follow"], cli_env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "] shield " not in line]
    assert "[1] shield      input: allowed by offline" in out.stdout
    assert lines[0] == "[1] plan        order_status(order_id='123456')"
    assert lines[1] == "[1] tool_call   order_status(order_id='123456')"
    assert lines[2].startswith("[1] observation order_status: Order id: 123456. Item: Herbal")
    answer = (
        "Yes — order 123456 shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late."
    )
    # The answer as the model writes it (from the turn's stream), then the step.
    assert lines[3] == f"[~] writing     {answer}"
    assert lines[4] == f"[1] answer      {answer}"
    assert f"answer (answered): {answer}" in out.stdout
    workflow_id = next(line.split()[1] for line in lines if line.startswith("workflow: "))
    assert workflow_id.startswith("turn-demo-")
    assert f"/namespaces/default/workflows/{workflow_id}/" in out.stdout

    shown = run(["client.py", "show", workflow_id], cli_env)
    assert shown.returncode == 0, shown.stderr
    assert "(completed)" in shown.stdout and "Herbal Handsoap" in shown.stdout

    # A reader that stops reading (`show ID | head -1`) ends it quietly.
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed:
        cut = subprocess.run(
            [sys.executable, "client.py", "show", workflow_id],
            cwd=ROOT,
            env=cli_env,
            stdout=closed,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert (cut.returncode, cut.stderr) == (0, "")


def test_show_follow_prints_a_running_turn_as_it_goes(
    cli_env: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    started = run(
        ["client.py", "ask", "I want to return order 123456, it arrived damaged.", "--no-wait"],
        cli_env,
    )
    assert started.returncode == 0, started.stderr
    turn = started.stdout.strip()
    following = subprocess.Popen(
        [sys.executable, "client.py", "show", turn, "--follow"],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The turn waits for consent; deciding it lets the follower see the rest.
    deadline = time.monotonic() + 30
    while "approval" not in run(["client.py", "show", turn], cli_env).stdout:
        assert time.monotonic() < deadline, "the turn never asked for approval"
        time.sleep(0.3)
    decided = run(["client.py", "reject", turn, "--reason", "changed my mind"], cli_env)
    assert decided.returncode == 0, decided.stderr
    out, err = following.communicate(timeout=60)
    assert following.returncode == 0, err
    kinds = [line.split()[1] for line in out.splitlines() if line.startswith("[")]
    assert kinds.index("approval") < kinds.index("decision") < kinds.index("answer")
    assert "answer (answered): " in out

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
        "error: QUESTION: the question is too long (1048575 characters; at most 4000)"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ask", "   "], "error: QUESTION: the question is empty"),
        (["ask", "Has order \udcff123456 shipped?"], "error: QUESTION: the question is not valid"),
        (["ask", "hi", "--customer", "x" * 501], "error: --customer: customer id must be"),
        (["ask", "hi", "--max-steps", "0"], "error: --max-steps: Input should be greater than"),
        (
            ["ask", "hi", "--max-steps", "10001"],
            "error: --max-steps: Input should be less than or equal to 10000",
        ),
        (["chat", "--approval-timeout", "0"], "error: --approval-timeout: give more than 0"),
        (["chat", "--idle-timeout", "0"], "error: --idle-timeout: give more than 0"),
        (["ask", "hi", "--max-duration", "inf"], "error: --max-duration: give a number of"),
        (["ask", "hi", "--max-duration", "nan"], "error: --max-duration: give a number of"),
        (["ask", "hi", "--max-duration", "1e308"], "error: --max-duration: give more than 0"),
        (["ask", "hi", "--approval-timeout", "inf"], "error: --approval-timeout: give a number"),
        (["chat", "--idle-timeout", "1e308"], "error: --idle-timeout: give more than 0"),
        (["chat", "--idle-timeout", "nan"], "error: --idle-timeout: give a number of minutes"),
        (["ask", "hi", "--max-duration", "604801"], "error: --max-duration: Input should be less"),
        (["ask", "hi", "--max-tokens", "0"], "error: --max-tokens: Input should be greater"),
        (["show", ""], "error: WORKFLOW_ID: give a turn's workflow id"),
        (["show", " "], "error: WORKFLOW_ID: give a turn's workflow id"),
        (["approve", ""], "error: WORKFLOW_ID: give a turn's workflow id"),
        (["reject", "a b"], "error: WORKFLOW_ID: 'a b' is not a workflow id"),
        (["approve", "turn-x", ""], "error: CALL_ID: give the id"),
        (["approve", "turn-x", "--tenant", "Acme Inc"], "error: --tenant: a tenant id must be"),
        (["ask", "hi", "--role", "support lead"], "error: --role: a role must be 1-64"),
        (["ask", "hi", "--user", " sam"], "error: --user: a user id must be 1-500"),
        (["audit", "--since", "yesterday"], "error: --since 'yesterday': give 7d, 12h, 30m"),
        (["audit", "--limit", "0"], "error: --limit"),
        (["ask", "hi", "--agent", "no such"], "error: --agent 'no such': give an agent's name"),
        (["list", "--agent", "x y"], "error: --agent 'x y': give an agent's name"),
        (["pending", "--customer", "bad\u200bid"], "error: --customer: customer id must be"),
        (["list", "--customer", " demo"], "error: --customer: customer id must be"),
        (["list", "--customer", "demo\n"], "error: --customer: customer id must be"),
        (["ask", "hi", "--customer", "demo\n"], "error: --customer: customer id must be"),
        (["ask", "hi", "--max-steps", "inf"], "error: --max-steps: give a whole number, not"),
        (["ask", "hi", "--max-steps", "2.5"], "error: --max-steps: give a whole number, not"),
        (["ask", "hi", "--max-tokens", "1e3"], "error: --max-tokens: give a whole number, not"),
        (["ask", "hi", "--max-duration", "soon"], "error: --max-duration: give a number of"),
        (["ask", "hi", "--model", "x" * 300], "error: --model: give a model spec"),
        (["ask", "hi", "--model", "open ai"], "error: --model: give a model spec"),
        (["chat", "--idle-timeout", "1e999"], "error: --idle-timeout: give a number of minutes"),
        (["list", "--limit", "-1"], "error: --limit: give a whole number from 1 to"),
        (["list", "--limit", "0"], "error: --limit: give a whole number from 1 to"),
        (["list", "--limit", "ten"], "error: --limit: give a whole number from 1 to"),
        (["list", "--outcome", "nope"], "error: --outcome: invalid choice: 'nope'"),
        (["web", "--port", "99999"], "error: --port: give a port from 0 to 65535"),
        (["web", "--port", "-1"], "error: --port: give a port from 0 to 65535"),
        (["--task-queue", "", "list"], "error: --task-queue: give a task queue's name"),
        (["--task-queue", "q" * 1001, "list"], "error: --task-queue: give a task queue's name"),
        (["reject", "turn-x", "--by", " "], "error: --by: give who decides"),
        (["reject", "turn-x", "--reason", "x" * 501], "error: --reason: String should have at"),
        ([], "error: the following arguments are required: command"),
        (["ask"], "error: the following arguments are required: question"),
        (["ask", "hi", "--bogus"], "error: unrecognized arguments: --bogus"),
        (["ask", "Has order 123456 shipped?"], "error: no Temporal server is named"),
        (["show", "turn-demo-nope"], "error: no Temporal server is named"),
    ],
)
def test_bad_input_gets_one_clear_line(
    cli_forks: Forks, forks_env: dict[str, str], args: list[str], message: str
) -> None:
    out = cli_forks.run(["client.py", *args], forks_env)
    assert out.returncode == 1
    assert out.stderr.strip().startswith(message), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker.py", "--task-queue", " "], "error: --task-queue: give a task queue's name"),
        (["worker.py", "--log-level", "loud"], "error: --log-level: invalid choice: 'loud'"),
        (["worker.py", "--metrics-port", "99999"], "error: metrics port '99999' is not a port"),
        (["worker.py", "--bogus"], "error: unrecognized arguments: --bogus"),
        (["-m", CODEC_SERVER, "--port", "99999"], "error: --port: give a port from 0 to 65535"),
        (["-m", CODEC_SERVER, "--port", "-1"], "error: --port: give a port from 0 to 65535"),
        (["-m", CODEC_SERVER, "--origin", "evil"], "error: --origin: give an origin like"),
        (["-m", CODEC_SERVER, "--host", "0.0.0.0"], "error: --host 0.0.0.0 is not loopback"),
    ],
)
def test_the_worker_and_the_codec_server_answer_bad_flags_in_one_line(
    cli_forks: Forks, forks_env: dict[str, str], args: list[str], message: str
) -> None:
    env = forks_env | {"AGENT_ENCRYPTION_KEY": "k1:" + base64.b64encode(bytes(32)).decode()}
    out = cli_forks.run(args, env)
    assert out.returncode == 1
    assert out.stderr.strip().startswith(message), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def lines_of(out: subprocess.CompletedProcess) -> list[str]:
    return out.stdout.strip().splitlines()


def test_ask_no_wait_then_pending_then_approve(
    cli_env: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    question = "I want to return order 123456, the soap is broken"
    started = run(["client.py", "ask", question, "--no-wait"], cli_env)
    assert started.returncode == 0, started.stderr
    (workflow_id,) = lines_of(started)
    assert workflow_id.startswith("turn-demo-")

    waiting = poll(
        lambda: run(["client.py", "pending"], cli_env), lambda o: workflow_id in o.stdout
    )
    (line,) = lines_of(waiting)
    wf, call_id, call, age, build = line.split("  ")
    assert wf == workflow_id and call.startswith("start_return(order_id='123456'")
    assert age.endswith("s") and re.fullmatch(r"b-[0-9a-f]{12}", build)

    shown = run(["client.py", "show", workflow_id], cli_env)
    assert "(running)" in shown.stdout and "awaits approval" in shown.stdout
    assert f"decide with: python client.py approve {workflow_id} {call_id}" in shown.stdout
    # Running, it says already which version runs it, and which agent.
    assert f"version: cli-test:{build}" in lines_of(shown)
    assert any(
        re.fullmatch(r"agent: shop \(fingerprint [0-9a-f]{12}\)", x) for x in lines_of(shown)
    )

    approved = run(["client.py", "approve", workflow_id, "--by", "alice", "--wait"], cli_env)
    assert approved.returncode == 0, approved.stderr
    assert lines_of(approved)[0] == f"approved: start_return ({call_id})"
    assert "answer (answered):" in approved.stdout
    returns = ShopStore(cli_env["AGENT_SHOP_DB"]).returns_for("123456")
    assert len(returns) == 1 and returns[0].return_id in approved.stdout

    listed = poll(
        lambda: run(["client.py", "list", "--outcome", "answered"], cli_env),
        lambda o: workflow_id in o.stdout,
    )
    assert "start_return" in listed.stdout and question in listed.stdout

    again = run(["client.py", "approve", workflow_id], cli_env)
    assert again.returncode == 1
    assert (
        again.stderr.strip() == f"error: turn {workflow_id} is completed: no call awaits approval"
    )
    unknown = run(["client.py", "reject", "turn-demo-nope", "--reason", "no"], cli_env)
    assert unknown.stderr.strip() == "error: no turn with workflow id 'turn-demo-nope'"


def ask_until_it_waits(cli_env: dict[str, str], question: str) -> tuple[subprocess.Popen[str], str]:
    """`ask` running until it prints how to decide its pending call; its workflow id."""
    asking = subprocess.Popen(
        [sys.executable, "client.py", "ask", question],
        cwd=ROOT,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert asking.stdout is not None
    while "decide with:" not in (hint := asking.stdout.readline()):
        assert hint, asking.stderr.read() if asking.stderr else ""
    return asking, hint.split("approve ")[1].split()[0]


def test_ask_waits_and_says_how_to_decide_then_reject(served: dict[str, str]) -> None:
    cli_env = served
    asking, workflow_id = ask_until_it_waits(
        cli_env, "Please start a return for 123456: wrong colour"
    )
    rejected = run(
        ["client.py", "reject", workflow_id, "--reason", "changed my mind", "--by", "bob"],
        cli_env,
    )
    assert rejected.returncode == 0, rejected.stderr
    rest, _ = asking.communicate(timeout=60)
    assert asking.returncode == 0
    assert "answer (answered): Not done: start_return" in rest
    assert "declined by bob: changed my mind" in rest
    assert ShopStore(cli_env["AGENT_SHOP_DB"]).returns_for("123456") == []


def test_ask_that_loses_its_server_says_so_in_one_line(
    cli_env: dict[str, str], worker: subprocess.Popen[str]
) -> None:
    """The worker that embeds the server stops while `ask` waits for an approval."""
    asking, workflow_id = ask_until_it_waits(cli_env, "Please start a return for 123456: too small")
    worker.terminate()
    worker.wait(timeout=30)
    _, err = asking.communicate(timeout=120)
    assert asking.returncode == 1
    assert "error: lost the Temporal server" in err and f"client.py show {workflow_id}" in err
    assert "Traceback" not in err


def test_chat_reads_lines_from_standard_input(served: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "client.py", "chat"],
        cwd=ROOT,
        env=served,
        input="Has order 123456 shipped?\nWhen will it arrive?\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith(("you> ", "agent> "))]
    assert said[0] == "you> Has order 123456 shipped?"
    assert said[1].startswith("agent> ") and "123456" in said[1]
    assert said[2] == "you> When will it arrive?"
    assert said[3].startswith("agent> ") and "Sorry" not in said[3]
    assert "(conversation chat-demo-" in out.stderr and "ended)" in out.stderr


def poll(command, ready, timeout: float = 30) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        out = command()
        if ready(out):
            return out
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(0.3)


def test_the_embedded_server_stops_when_its_worker_is_killed(cli_env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "worker.py"], cwd=ROOT, env=cli_env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and "worker ready" in proc.stdout.readline()
    port = int(cli_env["AGENT_SERVER_PORT"])
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            break  # nothing listens: the server went with its worker
        assert time.monotonic() < deadline, "the embedded server outlived its worker"
        time.sleep(0.2)


@pytest.fixture
def shared_server(env: WorkflowEnvironment, cli_env: dict[str, str]) -> dict[str, str]:
    """The test session's dev server, and a task queue no worker serves yet."""
    return {
        **cli_env,
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": f"cli-{uuid.uuid4().hex[:6]}",
    }


def test_show_without_a_worker_shows_the_history(shared_server: dict[str, str]) -> None:
    started = run(["client.py", "ask", "Has order 123456 shipped?", "--no-wait"], shared_server)
    assert started.returncode == 0, started.stderr
    assert "no live worker serves task queue" in started.stderr  # said before waiting
    (workflow_id,) = lines_of(started)
    t0 = time.monotonic()
    shown = run(["client.py", "show", workflow_id], shared_server, timeout=30)
    assert time.monotonic() - t0 < 20
    assert shown.returncode == 0, shown.stderr
    assert "(running)" in shown.stdout
    assert "no worker answered, so this is the history only" in shown.stderr
    assert "no live worker serves" not in shown.stderr  # said once, by show itself
    assert "Traceback" not in shown.stderr


async def test_a_named_server_gets_links_to_its_own_web_ui_or_none(
    shared_server: dict[str, str],
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """TEMPORAL_ADDRESS names a server whose Web UI nobody named: `ask` prints the turn's
    id and no link (never Temporal's 8233, which may be another server's UI);
    TEMPORAL_UI_URL or AGENT_UI_PORT name it, and the link follows, the id quoted. The
    client (`AgentClient.connect`) does the same."""
    # No UI named, and no store of the command's own: it reads the store of the worker
    # that runs here (tests/conftest.py).
    unnamed = ("AGENT_UI_PORT", "TEMPORAL_UI_URL", "AGENT_PAYLOAD_STORE", "AGENT_PAYLOAD_THRESHOLD")
    named = {k: v for k, v in shared_server.items() if k not in unnamed}
    question = ["client.py", "ask", "Has order 123456 shipped?", "--customer", "bob-x"]
    ui_port = free_port()
    async with harness.worker() as task_queue:
        env = {**named, "AGENT_TASK_QUEUE": task_queue}
        unknown, by_url, by_port = [
            await asyncio.to_thread(run, question, {**env, **more})
            for more in (
                {},
                {"TEMPORAL_UI_URL": "https://temporal-ui.example/"},
                {"AGENT_UI_PORT": str(ui_port)},
            )
        ]
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("AGENT_UI_PORT", raising=False)
        monkeypatch.delenv("TEMPORAL_UI_URL", raising=False)
        agents = await AgentClient.connect(task_queue=task_queue)
        monkeypatch.setenv("TEMPORAL_UI_URL", "https://temporal-ui.example")
        told = await AgentClient.connect(task_queue=task_queue)
    for out in (unknown, by_url, by_port):
        assert out.returncode == 0, out.stderr
        assert "8233" not in out.stdout + out.stderr
    (line,) = [x for x in lines_of(unknown) if x.startswith("workflow: ")]
    workflow_id = line.removeprefix("workflow: ")
    assert workflow_id.startswith("turn-bob~x-") and " " not in workflow_id
    (linked,) = [x for x in lines_of(by_url) if x.startswith("workflow: ")]
    assert re.fullmatch(
        r"workflow: turn-bob~x-\w+  https://temporal-ui\.example/namespaces/default/workflows/"
        r"turn-bob~x-\w+/[\w-]+/history",
        linked,
    ), linked
    (ported,) = [x for x in lines_of(by_port) if x.startswith("workflow: ")]
    assert f"  http://localhost:{ui_port}/namespaces/default/workflows/turn-bob~x-" in ported
    assert agents.ui_url is None and agents.turn_url(workflow_id) is None
    assert told.turn_url("turn-a%2Fb-k1") == (
        "https://temporal-ui.example/namespaces/default/workflows/turn-a%252Fb-k1"
    )


def asking_until(env: dict[str, str], said: str) -> tuple[subprocess.Popen[str], str]:
    """`ask "Has order 123456 shipped?"` running until its stderr says `said`; that line."""
    asking = subprocess.Popen(
        [sys.executable, "client.py", "ask", "Has order 123456 shipped?"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert asking.stderr is not None
    while said not in (line := asking.stderr.readline()):
        assert line, "ask ended early"
    return asking, line


@pytest.mark.slow
def test_ask_waits_for_a_worker_started_later(shared_server: dict[str, str]) -> None:
    """The turn waits for a worker, and so does `ask`: reads of its stream that no worker
    answers in time are asked again, not a traceback."""
    asking, _ = asking_until(shared_server, "started")
    reading = time.monotonic()  # its first read of the stream starts now
    assert asking.stderr is not None
    while "no worker has picked up" not in (line := asking.stderr.readline()):
        assert line, "ask ended early"
    # No worker until that read has waited its longest (`QUERY_WAIT`) and been asked
    # again. What is waited for is that time itself: nothing says a read timed out.
    time.sleep(max(0.0, reading + QUERY_WAIT.total_seconds() + 3 - time.monotonic()))
    worker = subprocess.Popen(
        [sys.executable, "worker.py"], cwd=ROOT, env=shared_server, stdout=subprocess.DEVNULL
    )
    try:
        out, err = asking.communicate(timeout=120)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert asking.returncode == 0, err
    assert "Traceback" not in err
    assert "answer (answered): Yes — order 123456 shipped" in out


def test_ctrl_c_on_ask_says_the_turn_goes_on(shared_server: dict[str, str]) -> None:
    asking, line = asking_until(shared_server, "started")
    asking.send_signal(signal.SIGINT)
    _, err = asking.communicate(timeout=30)
    assert asking.returncode == 130
    workflow_id = line.split()[1]
    assert f"the turn goes on. See it with: python client.py show {workflow_id}" in err
    assert "Traceback" not in err


def test_setup_mistakes_are_named_and_exit_non_zero(
    shared_server: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in shared_server.items() if k != "OPENAI_API_KEY"}
    env["AGENT_MODEL"] = "openai:gpt-4o"
    worker = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert worker.stdout is not None and "worker ready" in worker.stdout.readline()
        no_key = run(["client.py", "ask", "Has order 123456 shipped?"], env)
        unknown = run(["client.py", "ask", "hi", "--model", "gpt4:turbo"], env)
        nobody = run(["client.py", "ask", "hi", "--agent", "nosuch"], env)
    finally:
        worker.terminate()
        logged, _ = worker.communicate(timeout=30)
    # The asker reads the kind of failure; what to set is the operator's, in the worker's log.
    assert no_key.returncode == 3, no_key.stdout + no_key.stderr
    assert "the language model refused the request" in no_key.stdout
    assert "unavailable" not in no_key.stdout and "OPENAI_API_KEY" not in no_key.stdout
    assert "set OPENAI_API_KEY for the worker" in logged
    assert unknown.returncode == 3
    assert "the language model refused the request" in unknown.stdout
    assert "unknown model 'gpt4:turbo': use one of anthropic, bedrock, offline, openai" in logged
    assert nobody.returncode == 3, nobody.stdout + nobody.stderr
    assert "answer (unknown_agent): Sorry, I cannot answer: no agent 'nosuch'" in nobody.stdout
    assert "(this worker serves: shop)" in nobody.stdout
    assert "\nagent: nosuch (not served here)\n" in nobody.stdout


def test_worker_help_describes_every_option(cli_env: dict[str, str]) -> None:
    out = run(["worker.py", "--help"], cli_env)
    assert out.returncode == 0
    assert "--task-queue TASK_QUEUE" in out.stdout and "task queue to serve" in out.stdout
    assert "AGENT_MODEL" in out.stdout


def test_the_commands_name_themselves_as_they_were_run(shared_server: dict[str, str]) -> None:
    """Installed, they are `durable-agent` and `durable-agent-worker`; from the clone,
    `python client.py` and `python worker.py`: their usage and their hints say so."""
    installed = Path(sys.executable).parent
    env = {k: v for k, v in shared_server.items() if k != "AGENT_TASK_QUEUE"}
    queue = shared_server["AGENT_TASK_QUEUE"]
    for command, worker in (
        ([str(installed / "durable-agent")], "durable-agent-worker"),
        ([sys.executable, "client.py"], "python worker.py"),
    ):
        name = "durable-agent" if worker.startswith("durable") else "python client.py"
        helped = subprocess.run(
            [*command, "--help"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert helped.stdout.startswith(f"usage: {name} "), helped.stdout
        assert "support" not in helped.stdout
        asked = subprocess.run(
            [*command, "--task-queue", queue, "ask", "Has order 123456 shipped?", "--no-wait"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert asked.returncode == 0, asked.stderr
        assert f"until you start `{worker} --task-queue {queue}`" in asked.stderr
    helped = subprocess.run(
        [str(installed / "durable-agent-worker"), "--help"], capture_output=True, text=True
    )
    assert helped.stdout.startswith("usage: durable-agent-worker "), helped.stdout


async def heartbeats(server: dict[str, str]) -> int:
    """How many workers of the server's task queue have beaten twice (so a client
    knows their interval)."""
    client = await Client.connect(server["TEMPORAL_ADDRESS"])
    listed = await client.workflow_service.list_workers(
        ListWorkersRequest(namespace=client.namespace, page_size=200)
    )
    queue = server["AGENT_TASK_QUEUE"]
    return sum(
        w.worker_heartbeat.task_queue == queue
        and w.worker_heartbeat.elapsed_since_last_heartbeat.ToTimedelta() > timedelta(0)
        for w in listed.workers_info
    )


def test_ask_tells_a_killed_worker_from_a_live_one(shared_server: dict[str, str]) -> None:
    """A worker killed outright leaves its pollers listed for a minute; its heartbeats
    stop at once, and `ask` says no live worker serves the queue."""
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=shared_server,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and "worker ready" in proc.stdout.readline()
    # Live once the server has seen it poll (ready is printed as its pollers start).
    poll(
        lambda: run(["client.py", "ask", "hi", "--no-wait"], shared_server),
        lambda o: o.returncode == 0 and "no live worker" not in o.stderr,
    )
    # Killed once it has beaten twice: from then on its silence says it is gone.
    # (Before, only its polls speak for it, for as long as a long poll lasts.)
    deadline = time.monotonic() + 30
    while not asyncio.run(heartbeats(shared_server)):
        assert time.monotonic() < deadline, "the worker sent no second heartbeat"
        time.sleep(0.5)
    proc.kill()
    proc.wait()
    stale = poll(
        lambda: run(["client.py", "ask", "hi", "--no-wait"], shared_server),
        lambda o: "no live worker serves task queue" in o.stderr,
        timeout=40,
    )
    assert "the last one was seen" in stale.stderr


@pytest.mark.slow
async def test_a_worker_built_by_hand_is_live_for_as_long_as_it_polls(
    harness: Harness, shared_server: dict[str, str]
) -> None:
    """A plain `Worker` with the plugin, as docs/your-own-agent.md builds one: its runtime
    beats once a minute (the SDK's default), so liveness is its polling, past its first
    beat and past the renewal of its long polls."""
    queue = shared_server["AGENT_TASK_QUEUE"]
    client = await Client.connect(
        shared_server["TEMPORAL_ADDRESS"], plugins=[AgentPlugin(harness.agent())]
    )
    async with Worker(client, task_queue=queue):
        started = time.monotonic()
        while not (await workers(client, queue)).live:  # its first poll
            assert time.monotonic() - started < 30, "the worker never polled"
            await asyncio.sleep(0.2)
        while time.monotonic() - started < 80:  # its first beat comes at 60 s
            serving = await workers(client, queue)
            assert serving.live == 1, f"judged gone {time.monotonic() - started:.0f} s in"
            await asyncio.sleep(2)
        # Storing nothing of its own: it reads the store of this process's worker (built
        # by hand), tests/conftest.py.
        inline = {**shared_server, "AGENT_PAYLOAD_STORE": "off"}
        asked = await asyncio.to_thread(
            run, ["client.py", "ask", "Has order 123456 shipped?"], inline
        )
    assert asked.returncode == 0, asked.stderr
    assert "no live worker" not in asked.stderr and "shipped" in asked.stdout


def test_ask_prints_a_typed_value_as_json(cli_env: dict[str, str], tmp_path: Path) -> None:
    """An agent with an output type, from a module of one's own: `ask` prints its value."""
    (tmp_path / "facts_agent.py").write_text(
        "from dataclasses import replace\n"
        "from pydantic import BaseModel\n"
        "from durable_agent.shop.agent import support\n\n"
        "class OrderFacts(BaseModel):\n"
        "    order_id: str\n"
        "    item: str\n"
        "    quantity: int\n"
        "    status: str\n\n"
        "facts = replace(support, name='facts', output_type=OrderFacts)\n"
    )
    env = {**cli_env, "PYTHONPATH": str(tmp_path)}
    question = "Which item was ordered for 123456?"
    out = run(["client.py", "ask", "--embedded", "--agent", "facts_agent:facts", question], env)
    assert out.returncode == 0, out.stderr
    printed = out.stdout.split("output (answered):\n", 1)[1]
    value = json.loads(printed[: printed.index("\n}") + 2])
    assert value == {
        "order_id": "123456",
        "item": "Herbal Handsoap",
        "quantity": 2,
        "status": "shipped",
    }
