"""Tools from anywhere: a tool defined in code given to `exec`, in `python -` or in a
notebook is served. A worker's build id hashes what it can read of its tools' code
(`deployments.sources_of`), and a warning names each tool whose source it cannot.
"""

from __future__ import annotations

import linecache
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent
from durable_agent.plugin import build_worker
from durable_agent.runtime import deployments
from durable_agent.runtime.turns import start_turn
from durable_agent.settings import Settings
from durable_agent.types import TurnInput

QUESTION = "How much is the book 9780141187761?"

BOOKSTORE = """\
from pydantic import BaseModel, Field

from durable_agent import Agent, ToolContext, tool


class Isbn(BaseModel):
    isbn: str = Field(pattern=r"^\\d{13}$", description="the book's ISBN (13 digits)")


@tool(examples=["How much is the book 9780141187761?"], quick=True)
def book_price(args: Isbn, ctx: ToolContext[dict[str, str]]) -> str:
    \"\"\"Price of one book, by its ISBN.\"\"\"
    return f"Book {args.isbn} costs {ctx.deps.get(args.isbn, 'nothing: not in stock')}."


bookstore = Agent(name="bookstore", tools=[book_price], deps={"9780141187761": "$9.99"})
"""

CANNOT_READ = "the source of tool function book_price (module {module}) cannot be read"


def executed(source: str, filename: str = "<string>") -> dict[str, Any]:
    """The names `source` defines, run by `exec` as a module nobody can import."""
    namespace: dict[str, Any] = {"__name__": f"made_{uuid.uuid4().hex[:6]}"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def in_a_cell(source: str) -> dict[str, Any]:
    """`source` run as a notebook runs a cell: its text kept in `linecache` under the
    cell's name, where `inspect.getsource` finds it (IPython does this)."""
    name = f"<cell-{uuid.uuid4().hex[:6]}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    return executed(source, name)


def test_an_executed_tool_is_named_by_nothing_and_the_log_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    defined = executed(BOOKSTORE)
    with caplog.at_level(logging.WARNING, "durable_agent.deployments"):
        assert deployments.sources_of([defined["book_price"].fn]) == []
    assert CANNOT_READ.format(module=defined["__name__"]) in caplog.text
    assert "AGENT_BUILD_ID" in caplog.text


def test_a_notebook_cells_tool_is_named_by_its_own_source(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "durable_agent.deployments"):
        first = deployments.sources_of([in_a_cell(BOOKSTORE)["book_price"].fn])
        again = deployments.sources_of([in_a_cell(BOOKSTORE)["book_price"].fn])
        changed = BOOKSTORE.replace("not in stock", "sold out")
        other = deployments.sources_of([in_a_cell(changed)["book_price"].fn])
    assert caplog.text == ""
    assert len(first) == 1
    # The same code in another cell is the same version; changed code, a new one.
    assert [s.split(":")[1] for s in again] == [s.split(":")[1] for s in first]
    assert [s.split(":")[1] for s in other] != [s.split(":")[1] for s in first]


async def test_an_executed_tool_is_served_by_a_versioned_worker(
    env: WorkflowEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    bookstore: Agent = executed(BOOKSTORE)["bookstore"]
    queue = f"exec-{uuid.uuid4().hex[:8]}"
    settings = replace(Settings.from_env(), versioning=True, promote="always")
    with caplog.at_level(logging.WARNING, "durable_agent.deployments"):
        async with build_worker(env.client, bookstore, task_queue=queue, settings=settings) as w:
            handle = await start_turn(env.client, TurnInput(question=QUESTION), queue)
            result = await handle.result()
    assert "$9.99" in result.answer
    assert w.plugin.version is not None and w.plugin.version.build_id == w.plugin.code
    assert "cannot be read" in caplog.text


ASK_FROM_STDIN = BOOKSTORE + textwrap.dedent(
    """
        import asyncio

        from durable_agent import build_worker
        from durable_agent.runtime.server import connect
        from durable_agent.runtime.turns import start_turn
        from durable_agent.types import TurnInput


        async def main() -> None:
            conn = await connect()
            async with build_worker(conn.client, bookstore):
                handle = await start_turn(conn.client, TurnInput(question={question!r}))
                print((await handle.result()).answer)


        asyncio.run(main())
        """
).format(question=QUESTION)


def test_a_worker_whose_tool_came_over_stdin_answers(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`python -`: the tool's module says its file is '<stdin>', which no one can read."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    environ |= {
        "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        "AGENT_TASK_QUEUE": f"stdin-{uuid.uuid4().hex[:8]}",
        "AGENT_STATE_DIR": str(tmp_path),
    }
    ran = subprocess.run(
        [sys.executable, "-"],
        input=ASK_FROM_STDIN,
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "$9.99" in ran.stdout
    assert ran.stderr.startswith(CANNOT_READ.format(module="__main__")), ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr
