"""Ask the support agent; every question runs as one durable Temporal workflow.

python client.py ask "Has order 123456 shipped?" [--customer ID] [--follow]
python client.py show WORKFLOW_ID
python client.py demo           # the six sample questions, no setup needed
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

from pydantic import ValidationError
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from agent.types import DEFAULT_CUSTOMER, Step, TurnInput, TurnLimits, TurnOutput
from runtime.server import Connection, ServerUnavailable, connect
from runtime.settings import TASK_QUEUE
from workflows import AgentTurn

DEMO_QUESTIONS = [
    "Which item was ordered for 123456?",
    "When is my return rtn003 processed?",
    "How is the weather in Scotland right now?",
    "Which item was ordered for 383833?",
    "When is my return rtn123 processed?",
    "What is the impact of return rtn001 on world peace?",
]

FOLLOW_POLL_S = 0.2


class CliError(Exception):
    """An error shown to the user as one line, with a non-zero exit."""


def turn_id(customer_id: str) -> str:
    """`turn-<customer>-<8 hex>`: readable in the Web UI, unique per turn."""
    return f"turn-{customer_id}-{uuid.uuid4().hex[:8]}"


async def start_turn(
    client: Client, turn: TurnInput, task_queue: str = TASK_QUEUE
) -> WorkflowHandle:
    return await client.start_workflow(
        AgentTurn.run,
        turn,
        id=turn_id(turn.customer_id),
        task_queue=task_queue,
        static_summary=turn.question[:200],
        static_details=f"customer: {turn.customer_id} · model: {turn.model or 'worker default'}",
    )


async def follow(handle: WorkflowHandle) -> AsyncIterator[Step]:
    """Yield the turn's steps as they happen (polls the `progress` query)."""
    seen = 0
    while True:
        progress = await handle.query(AgentTurn.progress)
        for step in progress.steps[seen:]:
            yield step
        seen = len(progress.steps)
        if progress.done:
            return
        await asyncio.sleep(FOLLOW_POLL_S)


async def has_worker(client: Client, task_queue: str) -> bool:
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return bool(resp.pollers)


@contextlib.asynccontextmanager
async def session(task_queue: str, *, self_contained: bool) -> AsyncIterator[Connection]:
    """A connection; with `self_contained`, also an embedded server and an in-process
    worker when none are running, so the command works on a fresh machine."""
    conn = await connect(start_embedded=self_contained)
    try:
        if self_contained and not await has_worker(conn.client, task_queue):
            from worker import build_worker

            async with build_worker(conn.client, task_queue):
                yield conn
        else:
            if not await has_worker(conn.client, task_queue):
                print(
                    f"note: no worker polls task queue {task_queue!r} yet; "
                    "the turn waits until you start `python worker.py`",
                    file=sys.stderr,
                )
            yield conn
    finally:
        conn.close()


def print_result(conn: Connection, handle: WorkflowHandle, result: TurnOutput) -> None:
    print(f"\nanswer ({result.outcome.value}): {result.answer}")
    u = result.usage
    print(
        f"usage: {u.model_calls} model call(s), {u.input_tokens} in / {u.output_tokens} out tokens"
    )
    url = conn.workflow_url(handle.id, handle.result_run_id)
    print(f"workflow: {handle.id}" + (f"  {url}" if url else ""))


async def cmd_ask(args: argparse.Namespace) -> None:
    question = sys.stdin.read() if args.question == "-" else args.question
    try:
        turn = TurnInput(
            question=question,
            customer_id=args.customer,
            model=args.model,
            limits=TurnLimits(
                max_steps=args.max_steps,
                max_duration=timedelta(seconds=args.max_duration),
                max_tokens=args.max_tokens,
            ),
        )
    except ValidationError as e:
        raise CliError(
            "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        ) from None
    async with session(args.task_queue, self_contained=args.embedded) as conn:
        handle = await start_turn(conn.client, turn, args.task_queue)
        print(f"turn {handle.id} started", file=sys.stderr)
        if args.follow:
            async for step in follow(handle):
                print(step.render(), flush=True)
        result = await handle.result()
        print_result(conn, handle, result)


async def cmd_show(args: argparse.Namespace) -> None:
    async with session(args.task_queue, self_contained=False) as conn:
        handle = conn.client.get_workflow_handle_for(AgentTurn.run, args.workflow_id)
        try:
            desc = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise CliError(f"no turn with workflow id {args.workflow_id!r}") from None
            raise
        print(f"{desc.id} ({desc.status.name.lower() if desc.status else 'unknown'})")
        if desc.status == WorkflowExecutionStatus.RUNNING:
            progress = await handle.query(AgentTurn.progress)
            for step in progress.steps:
                print(step.render())
            return
        if desc.status != WorkflowExecutionStatus.COMPLETED:
            raise CliError(f"turn {desc.id} ended as {desc.status.name if desc.status else '?'}")
        result = await handle.result()
        for step in result.steps:
            print(step.render())
        print_result(conn, handle, result)


async def cmd_demo(args: argparse.Namespace) -> None:
    async with session(args.task_queue, self_contained=True) as conn:
        for question in DEMO_QUESTIONS:
            handle = await start_turn(
                conn.client, TurnInput(question=question, model=args.model), args.task_queue
            )
            result = await handle.result()
            print(f"Q: {question}\nA: {result.answer}\n   ({handle.id}, {result.outcome.value})\n")
        if conn.ui_url:
            print(f"See every turn in the Web UI: {conn.workflows_url}")
            if conn.server:
                print("(the embedded server stops with this command; `python worker.py` keeps one)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="client.py",
        description="Ask the durable support agent (one Temporal workflow per turn).",
    )
    p.add_argument("--task-queue", default=TASK_QUEUE, help="default: %(default)s")
    sub = p.add_subparsers(dest="command", required=True)

    ask = sub.add_parser("ask", help="ask one question")
    ask.add_argument("question", help="the question, or - to read it from standard input")
    ask.add_argument(
        "--customer", default=DEFAULT_CUSTOMER, help="customer id (default: %(default)s)"
    )
    ask.add_argument("--follow", action="store_true", help="print each step as it happens")
    ask.add_argument(
        "--model", default="", help="model spec, e.g. openai:gpt-4o (default: the worker's)"
    )
    ask.add_argument("--max-steps", type=int, default=TurnLimits().max_steps)
    ask.add_argument(
        "--max-duration",
        type=float,
        default=TurnLimits().max_duration.total_seconds(),
        help="seconds (default: %(default)s)",
    )
    ask.add_argument("--max-tokens", type=int, help="token budget of the turn (default: none)")
    ask.add_argument(
        "--embedded",
        action="store_true",
        help="start a server and worker in this process if none are running",
    )
    ask.set_defaults(run=cmd_ask)

    show = sub.add_parser("show", help="print the steps of a running or finished turn")
    show.add_argument("workflow_id")
    show.set_defaults(run=cmd_show)

    demo = sub.add_parser("demo", help="run the six sample questions end to end")
    demo.add_argument("--model", default="", help="model spec (default: the worker's)")
    demo.set_defaults(run=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        asyncio.run(args.run(args))
    except (CliError, ServerUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown: the SDK's Rust runtime threads can outlive the
    # event loop, and finalizing under them aborts a short-lived client process
    # ("PyGILState_Release ... finalizing", temporalio/sdk-python#300).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
