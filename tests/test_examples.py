"""Agents of one's own, as a person meets them: `docs/your-own-agent.md` followed as
written (its module, its commands, its outputs), and the help desk example run from its
own folder, its write waiting for consent and running once across a SIGKILL; then their
tests, as `docs/testing.md` writes them and as the help desk's own test file has them."""

from __future__ import annotations

import importlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.request import Request, urlopen

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput
from tests.conftest import Harness

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DOC = ROOT / "docs" / "your-own-agent.md"
TESTING_DOC = ROOT / "docs" / "testing.md"
HELPDESK = ROOT / "examples" / "helpdesk"


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def until(what: Callable[[], str], ready: Callable[[str], bool], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = what()
        if ready(out):
            return out
        assert time.monotonic() < deadline, out
        time.sleep(0.3)


class Process:
    """A long-running command (a worker, the web chat), stopped with the test."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def line(self, timeout: float = 120) -> str:
        """Its next line; a line that never comes fails the test with what came instead
        (not a read blocked until the suite's timeout)."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no further line in {timeout:g} s; it printed {self.seen}"
            ) from None
        self.seen.append(line)
        return line

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


def sample(page: str, first: str) -> list[str]:
    """The lines of the page's sample output (a block with no language) that begins
    with `first`."""
    blocks: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in page.splitlines():
        if line.startswith("```"):
            fence = line[3:] if fence is None else None
            if fence is not None:
                blocks.append((fence, []))
        elif fence is not None:
            blocks[-1][1].append(line)
    (block,) = [b for lang, b in blocks if not lang and b and b[0].startswith(first)]
    return block


def as_on_the_page(lines: list[str], queue: str) -> list[str]:
    """Printed lines as the page shows them: its default task queue, and `…` for what
    differs each time (hashes, ids, token counts, the server's port)."""
    shown = []
    for line in lines:
        line = line.replace(queue, "agent-turns")
        line = re.sub(r"\b(b|turn-demo)-[0-9a-f]{8,}", r"\1-…", line)
        line = re.sub(r"fingerprint [0-9a-f]{12}", "fingerprint …", line)
        line = re.sub(r"/turn-demo-…/[0-9a-f-]{36}/history", "/turn-demo-…/history", line)
        line = re.sub(r"model call\(s\), .* cost", "model call(s), … cost", line)
        line = re.sub(r"(localhost|127\.0\.0\.1):\d+", r"\1:…", line)
        shown.append(line)
    return shown


@pytest.fixture
def server_env(env: WorkflowEnvironment) -> Iterator[dict[str, str]]:
    yield {
        **os.environ,
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": f"own-{uuid.uuid4().hex[:6]}",
        # The page's worker runs its own server, whose Web UI it knows; a server named by
        # TEMPORAL_ADDRESS gets links only where its UI is named too.
        "TEMPORAL_UI_URL": "http://localhost:8233",
    }


def test_the_your_own_agent_page_works_as_written(
    tmp_path: Path, server_env: dict[str, str]
) -> None:
    page = DOC.read_text()
    module, *_ = code_blocks(page, "python")
    folder = tmp_path / "bookstore"
    folder.mkdir()
    (folder / "bookstore.py").write_text(module)

    worker = Process(
        [str(BIN / "durable-agent-worker"), "--agent", "bookstore:agent"], folder, server_env
    )
    queue = server_env["AGENT_TASK_QUEUE"]
    try:
        # The page shows what the worker prints (on its own server, default queue).
        started = [worker.line() for _ in sample(page, "worker ready")]
        started[0] = re.sub(r"\((\S+)\)", r"(embedded server \1)", started[0])
        assert as_on_the_page(started, queue) == sample(page, "worker ready"), started
        asked = run(
            [
                str(BIN / "durable-agent"),
                "ask",
                "--agent",
                "bookstore",
                "How much is the book 9780141187761?",
            ],
            folder,
            server_env,
        )
        printed = [line for line in asked.splitlines() if line]
        assert as_on_the_page(printed, queue) == sample(page, "answer ("), printed

        # A write waits for a person, and runs once approved.
        started = run(
            [
                str(BIN / "durable-agent"),
                "ask",
                "--agent",
                "bookstore",
                "--no-wait",
                "Please hold the book 9780141187761 for me.",
            ],
            folder,
            server_env,
        )
        turn_id = started.strip()
        waiting = until(
            lambda: run([str(BIN / "durable-agent"), "pending"], folder, server_env),
            lambda out: turn_id in out,
        )
        assert "hold_book(isbn='9780141187761')" in waiting
        approved = run(
            [str(BIN / "durable-agent"), "approve", turn_id, "--wait"], folder, server_env
        )
        assert "approved: hold_book" in approved and "held for demo" in approved
        with sqlite3.connect(folder / "books.db") as db:
            assert db.execute("SELECT count(*) FROM holds").fetchone() == (1,)

        # The same hold again: the tool's check answers at once, as the page says; nobody
        # is asked and nothing is written.
        [(command, said)] = re.findall(r"\n(durable-agent ask .*)\n# (answer .*held.*)\n", page)
        again = run([str(BIN / "durable-agent"), *shlex.split(command)[1:]], folder, server_env)
        assert said in again.splitlines(), again
        assert "hold_book" not in run([str(BIN / "durable-agent"), "pending"], folder, server_env)
        with sqlite3.connect(folder / "books.db") as db:
            assert db.execute("SELECT count(*) FROM holds").fetchone() == (1,)

        # The web chat speaks in the agent's words and answers with its tools.
        web = Process(
            [str(BIN / "durable-agent"), "web", "--agent", "bookstore:agent", "--port", "0"],
            folder,
            server_env,
        )
        try:
            url = re.search(r"http://\S+/", web.line())
            assert url, "the web chat printed no address"
            with urlopen(url.group(0) + "api/session", timeout=30) as response:
                session = json.load(response)
            assert session["agent"]["title"] == "The Bookstore"
            assert "How much is the book 9780141187761?" in session["agent"]["examples"]
            request = Request(
                url.group(0) + "api/chats",
                data=json.dumps({"text": "How much is the book 9780141187761?"}).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urlopen(request, timeout=60) as response:
                turn_id = json.load(response)["turn_id"]
        finally:
            web.stop()
        shown = until(
            lambda: run([str(BIN / "durable-agent"), "show", turn_id], folder, server_env),
            lambda out: "answer (answered)" in out,
        )
        assert "Price: $9.99" in shown

        # With no --agent, beside the bookstore's worker: the bookstore's words still.
        web = Process([str(BIN / "durable-agent"), "web", "--port", "0"], folder, server_env)
        try:
            url = re.search(r"http://\S+/", web.line())
            assert url, "the web chat printed no address"
            with urlopen(url.group(0) + "api/session", timeout=30) as response:
                assert json.load(response)["agent"]["title"] == "The Bookstore"
        finally:
            web.stop()
    finally:
        worker.stop()


def test_the_help_desk_example_waits_for_consent_and_writes_once_across_a_sigkill(
    tmp_path: Path, server_env: dict[str, str]
) -> None:
    env = {**server_env, "HELPDESK_DB": str(tmp_path / "helpdesk.db")}
    worker_args = [sys.executable, str(ROOT / "worker.py"), "--agent", "helpdesk:agent"]
    client = [sys.executable, str(ROOT / "client.py")]
    worker = Process(worker_args, HELPDESK, env)
    try:
        assert worker.line().startswith("worker ready")
        assert worker.line() == (
            "agent helpdesk: ticket_status, service_status, open_ticket (writes, needs approval), "
            "refund (writes, needs approval)"
        )
        vpn = run([*client, "ask", "--agent", "helpdesk", "Is the VPN down?"], HELPDESK, env)
        assert "Status: degraded" in vpn
        asked = run(
            [
                *client,
                "ask",
                "--agent",
                "helpdesk",
                "--no-wait",
                "Please open a ticket: my laptop will not boot.",
            ],
            HELPDESK,
            env,
        )
        turn_id = asked.strip()
        until(lambda: run([*client, "pending"], HELPDESK, env), lambda out: turn_id in out)
        worker.stop(signal.SIGKILL)  # while the write waits for consent
        worker = Process(worker_args, HELPDESK, env)
        assert worker.line().startswith("worker ready")
        approved = run([*client, "approve", turn_id, "--wait"], HELPDESK, env)
    finally:
        worker.stop()
    assert "approved: open_ticket" in approved
    assert "Ticket id: INC-1004" in approved
    with sqlite3.connect(tmp_path / "helpdesk.db") as db:
        opened = db.execute("SELECT count(*) FROM tickets WHERE opened_by_key IS NOT NULL")
        assert opened.fetchone() == (1,)


def test_the_help_desks_write_runs_once_when_its_worker_is_killed_while_writing(
    tmp_path: Path, server_env: dict[str, str]
) -> None:
    """Approved, the ticket is written, and the worker is SIGKILLed before Temporal hears
    of it: the worker started again runs the call again, which finds the ticket its key
    opened and opens no second one."""
    env = {**server_env, "HELPDESK_DB": str(tmp_path / "helpdesk.db")}
    marker = tmp_path / "killed"
    worker_args = [
        sys.executable,
        str(ROOT / "tests" / "helpdesk_crashing_worker.py"),
        str(marker),
        "--agent",
        "helpdesk:agent",
    ]
    client = [sys.executable, str(ROOT / "client.py")]
    worker = Process(worker_args, HELPDESK, env)
    try:
        assert worker.line().startswith("worker ready")
        asked = run(
            [
                *client,
                "ask",
                "--agent",
                "helpdesk",
                "--no-wait",
                "Open a ticket: the printer is on fire.",
            ],
            HELPDESK,
            env,
        )
        turn_id = asked.strip()
        until(lambda: run([*client, "pending"], HELPDESK, env), lambda out: turn_id in out)
        assert "approved: open_ticket" in run([*client, "approve", turn_id], HELPDESK, env)
        assert worker.proc.wait(timeout=60) == -signal.SIGKILL  # right after the write
        assert marker.exists()
        worker = Process(worker_args, HELPDESK, env)
        assert worker.line().startswith("worker ready")
        shown = until(
            lambda: run([*client, "show", turn_id], HELPDESK, env),
            lambda out: "answer (" in out,
            timeout=120,
        )
    finally:
        worker.stop()
    assert "answer (answered)" in shown and "Ticket id: INC-1004" in shown
    with sqlite3.connect(tmp_path / "helpdesk.db") as db:
        opened = db.execute("SELECT opened_by_key FROM tickets WHERE opened_by_key IS NOT NULL")
        assert [key for (key,) in opened.fetchall()] == [marker.read_text()]


@pytest.fixture
def help_desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    """The help desk's agent, imported from its folder as its worker does, over a
    fresh copy of its data."""
    monkeypatch.setenv("HELPDESK_DB", str(tmp_path / "helpdesk.db"))
    monkeypatch.syspath_prepend(str(HELPDESK))
    try:
        yield importlib.import_module("helpdesk").agent
    finally:
        for name in ("helpdesk", "desk"):
            sys.modules.pop(name, None)


HELP_DESK_TALK = [
    ("Hello", "Hello! I can help with: "),
    ("Hi there!", "Hello! I can help with: "),
    ("Good morning", "Hello! I can help with: "),
    ("Thanks!", "You're welcome! If there is anything else, I can help with: "),
    ("Thank you very much", "You're welcome! If there is anything else, I can help with: "),
    ("Bye", "Goodbye!"),
    ("Can you reset my password?", "Sorry, I can't reset that for you here."),
    ("Is email working?", "Status: operational"),
]


async def test_the_help_desk_answers_greetings_thanks_and_what_it_cannot_do(
    harness: Harness, help_desk: Agent
) -> None:
    """Its tools' descriptions name its services in parentheses: what it offers in a
    greeting is said without them, and no answer is taken for one naming a service
    the question did not."""
    async with harness.worker(agents=[help_desk]) as task_queue:
        for question, says in HELP_DESK_TALK:
            handle = await start_turn(harness.client, TurnInput(question=question), task_queue)
            result = await handle.result()
            assert result.outcome is Outcome.ANSWERED, (question, result.answer)
            assert result.answer.startswith(says) or says in result.answer, (question, result)
            assert "(" not in result.answer, (question, result.answer)


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest run in `folder`, as its owner runs it there (its own pyproject.toml)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_testing_page_takes_the_bookstore_to_passing_tests(tmp_path: Path) -> None:
    """docs/testing.md followed as written, in the folder docs/your-own-agent.md made: its
    pytest settings, its test file, its two commands."""
    folder = tmp_path / "bookstore"
    folder.mkdir()
    module, *_ = code_blocks(DOC.read_text(), "python")
    (folder / "bookstore.py").write_text(module)
    page = TESTING_DOC.read_text()
    [settings] = code_blocks(page, "toml")
    (folder / "pyproject.toml").write_text(settings)
    tests, *_ = code_blocks(page, "python")
    (folder / "test_bookstore.py").write_text(tests)
    record, run_them = [
        line.split("#")[0].split()
        for line in code_blocks(page.split("## 3. Run them")[1], "bash")[0].splitlines()
    ]
    assert record == ["python", "test_bookstore.py"] and run_them[:3] == ["python", "-m", "pytest"]
    run([sys.executable, *record[1:]], folder, dict(os.environ))
    assert sorted(p.name for p in (folder / "histories").iterdir()) == ["price.id", "price.json"]
    assert not (folder / "books.db").exists()  # the recording's data went elsewhere

    done = pytest_in(folder, *run_them[3:])

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout), done.stdout
    assert not (folder / "books.db").exists()  # each test's shelf in its own folder


def test_the_help_desks_own_tests_pass_where_a_team_copies_them(tmp_path: Path) -> None:
    """examples/helpdesk/test_helpdesk.py with the agent and its recorded turns, copied to
    a folder of its own with the pytest settings of docs/testing.md: TestModel and
    FunctionModel turns, consent given and refused, a bounded refund, a 3-day timeout, the
    replay gate."""
    folder = tmp_path / "helpdesk"
    shutil.copytree(HELPDESK, folder, ignore=shutil.ignore_patterns("__pycache__", "*.db"))
    [settings] = code_blocks(TESTING_DOC.read_text(), "toml")
    (folder / "pyproject.toml").write_text(settings)

    done = pytest_in(folder, "-q", "test_helpdesk.py", "--durations=0")

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b11 passed\b", done.stdout), done.stdout
    assert not list(folder.glob("*.db"))  # the tests' data stayed in their own folders
