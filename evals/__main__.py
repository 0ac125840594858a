"""python -m durable_agent.evals tau2 --domain retail --model oracle [--tasks 0,1,2 | --split base]
                     [--concurrency N] [--chaos | --plain | --floor]
python -m durable_agent.evals tau2 --domain retail --model openai:gpt-4o
                     [--user-model SPEC] [--trials K]
python -m durable_agent.evals questions [--model offline] [--table seed|situations|all]
python -m durable_agent.evals replay RUN_ID --model SPEC [--concurrency N]
python -m durable_agent.evals agentdojo --suite banking [--tasks …] [--injections …]
                     [--attack important_instructions|none] [--model obedient|oracle|SPEC]
                     [--approve careful|all|none] [--plain | --chaos]

Runs τ²-bench tasks as durable episodes (`evals/run.py`) against the Temporal server
the environment names (else this folder's own, else one this process starts), prints
each episode as it ends and a total, and writes the report as JSON and CSV. Running
the same command again (with the same AGENT_STATE_DIR) continues the same run; a
server lost mid-run stops it in one line, and the same command goes on once it is
back. `--chaos` serves the episodes from two worker processes with injected faults,
one SIGKILLed every few seconds (`evals/chaos.py`); `--plain` runs the same episodes
in a plain loop with no Temporal, the floor the durable run's time is reported
against, and `--floor` as the barest Temporal workflows (`evals/floor.py`), Temporal's
own floor on the same server. A real model (`evals/conversations.py`) runs each task
`--trials` times as a conversation with τ²-bench's own user simulator as the
customer, and reports pass^k.
`replay` asks another model every episode of an earlier oracle run, its tool calls
answered from the record while they repeat the recording's (`evals/replay.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import tempfile
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio.service import RPCError

T = TypeVar("T")

if TYPE_CHECKING:
    from durable_agent.runtime.server import Connection


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m durable_agent.evals", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="suite", required=True)
    t = sub.add_parser("tau2", help="τ²-bench tasks as durable episodes")
    t.add_argument("--domain", default="retail", help="a τ²-bench domain (default: retail)")
    t.add_argument(
        "--model",
        default="oracle",
        help="oracle (each task's expected actions, one turn), or a real model the worker "
        "has (openai:<model>, bedrock:<model-id>): a conversation with τ²-bench's user "
        "simulator (default: oracle)",
    )
    t.add_argument(
        "--user-model",
        help="who plays the customer, through LiteLLM: openai:<model> or bedrock:<model-id> "
        "(default: --model)",
    )
    t.add_argument(
        "--trials", type=int, default=1, help="each task this many times: pass^k (default: 1)"
    )
    which = t.add_mutually_exclusive_group()
    which.add_argument("--tasks", help="task ids, comma-separated (default: all)")
    which.add_argument("--split", help="a task split of the domain (e.g. base)")
    t.add_argument("--concurrency", type=int, default=4, help="episodes at once (default: 4)")
    t.add_argument(
        "--report", type=Path, default=Path("evals-results"), help="where JSON and CSV go"
    )
    mode = t.add_mutually_exclusive_group()
    mode.add_argument(
        "--chaos",
        action="store_true",
        help="two worker processes, transient faults, a worker SIGKILLed every few seconds",
    )
    mode.add_argument("--plain", action="store_true", help="the floor: a plain loop, no Temporal")
    mode.add_argument(
        "--floor",
        action="store_true",
        help="Temporal's floor: the same episodes as the barest workflows, writes approved",
    )
    q = sub.add_parser("questions", help="the demo shop's sample questions as durable turns")
    q.add_argument("--model", default="offline", help="model spec (default: offline)")
    q.add_argument(
        "--table",
        choices=["seed", "situations", "all"],
        default="all",
        help="which questions (default: all)",
    )
    q.add_argument(
        "--report", type=Path, default=Path("evals-results"), help="where JSON and CSV go"
    )
    r = sub.add_parser(
        "replay",
        help="an earlier run's episodes asked of another model, tool calls from the record",
    )
    r.add_argument("run", metavar="RUN_ID", help="the run's id: its report's name")
    r.add_argument(
        "--model",
        required=True,
        help="oracle (each task's own), or a model the worker has (offline, "
        "openai:<model>, bedrock:<model-id>)",
    )
    r.add_argument("--concurrency", type=int, default=4, help="episodes at once (default: 4)")
    r.add_argument(
        "--report", type=Path, default=Path("evals-results"), help="where JSON and CSV go"
    )
    d = sub.add_parser("agentdojo", help="AgentDojo's prompt-injection suites as durable episodes")
    d.add_argument(
        "--suite", dest="dojo", default="banking", help="banking, slack, travel or workspace"
    )
    d.add_argument("--tasks", help="user task ids, comma-separated (default: all)")
    d.add_argument("--injections", help="injection task ids, comma-separated (default: all)")
    d.add_argument(
        "--attack",
        default="important_instructions",
        help="an AgentDojo attack, or none for utility alone (default: important_instructions)",
    )
    d.add_argument(
        "--model",
        default="obedient",
        help="obedient (default: obeys every injection), oracle, or a model the worker has "
        "(openai:<model>, anthropic:<model>, bedrock:<model-id>)",
    )
    d.add_argument("--approve", choices=["careful", "all", "none"], default="careful")
    d.add_argument("--concurrency", type=int, default=4, help="episodes at once (default: 4)")
    d.add_argument("--plain", action="store_true", help="the undefended baseline: a plain loop")
    d.add_argument(
        "--chaos",
        action="store_true",
        help="two worker processes, transient faults, a worker SIGKILLed every few seconds",
    )
    d.add_argument("--report", type=Path, default=Path("evals-results"), help="where the JSON goes")
    w = sub.add_parser("worker", help=argparse.SUPPRESS)  # a chaos run's worker process
    w.add_argument("--domain", required=True)
    w.add_argument("--tasks", required=True)
    w.add_argument("--store", type=Path, required=True)
    w.add_argument("--task-queue", required=True)
    dw = sub.add_parser("dojo-worker", help=argparse.SUPPRESS)  # AgentDojo's, likewise
    dw.add_argument("--suite", dest="dojo", required=True)
    dw.add_argument("--store", type=Path, required=True)
    dw.add_argument("--task-queue", required=True)
    dw.add_argument("--approve", choices=["careful", "all", "none"], required=True)
    args = p.parse_args(argv)
    try:
        if args.suite == "questions":
            return asyncio.run(_questions(args))
        if args.suite == "replay":
            return asyncio.run(_replay(args))
        if args.suite == "agentdojo":
            return asyncio.run(_agentdojo(args))
        if args.suite == "dojo-worker":
            from durable_agent.evals import agentdojo
            from durable_agent.runtime.server import ServerUnavailable

            try:
                asyncio.run(agentdojo.serve(args.dojo, args.store, args.task_queue, args.approve))
            except (agentdojo.AgentDojoSetupError, ServerUnavailable) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            return 0
        if args.suite == "worker":
            from durable_agent.evals.run import serve
            from durable_agent.evals.tau2 import EvalSetupError
            from durable_agent.runtime.server import ServerUnavailable

            try:
                asyncio.run(serve(args.domain, args.tasks.split(","), args.store, args.task_queue))
            except (EvalSetupError, ServerUnavailable) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            return 0
        return asyncio.run(_tau2(args))
    except KeyboardInterrupt:
        print("stopped: run the same command again to go on", file=sys.stderr)
        return 130


async def _tau2(args: argparse.Namespace) -> int:
    from durable_agent.errors import NotAllowed
    from durable_agent.evals import tau2
    from durable_agent.evals.chaos import ChaosError, kill_every
    from durable_agent.evals.run import (
        Scoring,
        against_floor,
        plain_run,
        run_id,
        run_tasks,
        totals,
        write_reports,
    )
    from durable_agent.runtime.server import ServerUnavailable
    from durable_agent.settings import state_dir

    real = args.model != "oracle"
    try:
        if not 1 <= args.concurrency <= 64:
            raise tau2.EvalSetupError("--concurrency: give 1 to 64")
        if not 1 <= args.trials <= 100:
            raise tau2.EvalSetupError("--trials: give 1 to 100")
        if real:
            from durable_agent.evals.conversations import check_models

            if args.chaos or args.plain or args.floor:
                raise tau2.EvalSetupError(
                    "--chaos, --plain and --floor run the oracle; with a real model, kill the run "
                    "yourself and run it again: it goes on where it was"
                )
            check_models(args.model, args.user_model or args.model)
        elif args.user_model or args.trials != 1:
            raise tau2.EvalSetupError(
                "--user-model and --trials are for real models: the oracle has no customer"
            )
        ids = task_ids(args.tasks)
        if args.split is not None and not args.split.strip():
            raise tau2.EvalSetupError("--split: give a split's name (e.g. base), or leave it out")
        writable(args.report)
        tasks = tau2.tasks(args.domain, ids, args.split)
        for task in tasks:
            (tau2.conversation_scope if real else tau2.expected_actions)(task)
        if args.chaos:
            kill_every()
    except (tau2.EvalSetupError, NotAllowed, ValueError, ChaosError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if real:
        return await _tau2_real(args, tasks)
    state = state_dir() / "evals"
    ids = [t.id for t in tasks]
    run = run_id(args.domain, "oracle", ids, args.chaos, state_dir=state)
    floor = args.report / f"plain-{run_id(args.domain, 'oracle', ids)}.json"
    temporal_floor = args.report / f"floor-{run_id(args.domain, 'oracle', ids)}.json"
    if args.plain:
        plain = await plain_run(args.domain, tasks, state_dir=state, concurrency=args.concurrency)
        floor.parent.mkdir(parents=True, exist_ok=True)
        passed = sum(plain.passed)
        floor.write_text(
            json.dumps(
                {
                    "seconds": round(plain.seconds, 2),
                    "passed": passed,
                    "episodes": plain.episodes,
                    "cpu_seconds": plain.cpu_seconds,
                }
            )
        )
        print(
            f"plain loop (no Temporal): {passed}/{len(plain.passed)} passed in "
            f"{plain.seconds:.1f} s; the floor for this run: {floor}"
        )
        return 0 if all(plain.passed) else 1
    try:
        conn = await _connect()
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.floor:
        return await _temporal_floor(conn, args, tasks, state, temporal_floor, floor)
    scoring = Scoring(len(tasks))
    reports = await _on_server(
        conn,
        run_tasks(
            conn.client,
            args.domain,
            tasks,
            state_dir=state,
            concurrency=args.concurrency,
            ui_url=conn.ui_url or "",
            chaos=args.chaos,
            scoring=scoring,
        ),
        ChaosError,
    )
    if reports is None:
        return 1
    total = totals(reports)
    ran_now = [r for r in reports if not r.from_earlier]
    if ran_now:
        # The turns' time: until the last turn ended (scoring aside, as for the floor).
        total["turns_seconds"] = max(r.ended_s for r in ran_now)
    # This process's CPU is the run's when its worker ran here (not chaos's workers).
    cpu = None if args.chaos else scoring.cpu_seconds
    if cpu is not None and all(r.timed_whole and not r.from_earlier for r in reports):
        total["cpu_seconds"] = cpu
    if floor.exists():
        total.update(against_floor(reports, json.loads(floor.read_text())))
    if temporal_floor.exists():
        over = against_floor(reports, json.loads(temporal_floor.read_text()), cpu)
        total.update({f"temporal_{k}": v for k, v in over.items()})
    as_json, as_csv = write_reports(reports, args.report / run, total)
    print(
        f"{total['passed']}/{total['episodes']} passed"
        + _timing(total, len(reports) - len(ran_now))
        + f"; {total['model_calls']} model calls; "
        f"longest turn {total['longest_history_events']} events, "
        f"{total['longest_history_bytes'] / 1e6:.2f} MB; report: {as_json}, {as_csv}"
    )
    return 0 if total["passed"] == total["episodes"] else 1


async def _temporal_floor(
    conn: Connection,
    args: argparse.Namespace,
    tasks: list[Any],
    state: Path,
    report: Path,
    plain: Path,
) -> int:
    """`--floor`: the episodes as the barest workflows on the run's server
    (`evals/floor.py`); its times are what later durable runs of these tasks are
    measured against, beside the plain loop's (whose report, at `plain`, says what this
    floor is over it)."""
    from durable_agent.evals.floor import floor_run

    work = floor_run(conn.client, args.domain, tasks, state_dir=state, concurrency=args.concurrency)
    found = await _on_server(conn, work)
    if found is None:
        return 1
    passed = sum(found.passed)
    report.parent.mkdir(parents=True, exist_ok=True)
    took = {
        "seconds": round(found.seconds, 2),
        "passed": passed,
        "episodes": found.episodes,
        "cpu_seconds": found.cpu_seconds,
    }
    report.write_text(json.dumps(took))
    over = ""
    if plain.exists():
        loop: dict[str, float] = json.loads(plain.read_text()).get("episodes") or {}
        both = [t for t in found.episodes if t in loop]
        if both:
            ratio = sum(found.episodes[t] for t in both) / max(sum(loop[t] for t in both), 1e-9)
            over = f", {ratio:.2f}× the plain loop's time per episode"
    print(
        f"Temporal's floor (the barest workflows, writes approved): {passed}/"
        f"{len(found.passed)} passed in {found.seconds:.1f} s{over}; the floor for this run: "
        f"{report}"
    )
    return 0 if all(found.passed) else 1


async def _on_server(
    conn: Connection, work: Awaitable[T], *expected: type[BaseException]
) -> T | None:
    """What `work` gives on the run's server, the connection closed after it; None once
    a lost server, or an error of the `expected` kinds, is said in one line."""
    from durable_agent.errors import ServerLost
    from durable_agent.runtime.server import ServerUnavailable

    said: tuple[type[BaseException], ...] = (ServerUnavailable, *expected)
    try:
        return await work
    except ServerLost as e:  # the client's word for it: a run says what a run does then
        print(f"error: {lost(conn.where, e.said)}", file=sys.stderr)
    except said as e:
        print(f"error: {e}", file=sys.stderr)
    except RPCError as e:
        print(f"error: {lost(conn.where, e.message)}", file=sys.stderr)
    finally:
        await conn.aclose()
    return None


async def _connect() -> Connection:
    """The run's Temporal server (`runtime.server.connect`), through a runtime whose
    Core reports errors only: its warnings (each retry of each call while a server is
    away, a task another worker already completed) are not the run's to show; a lost
    server is said once, by the run."""
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    from durable_agent.runtime import runtimes
    from durable_agent.runtime.server import connect

    quiet = LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    runtime = runtimes.track(Runtime(telemetry=TelemetryConfig(logging=quiet)))
    # And the SDK's Python side: an activity that fails as the server goes away (its
    # heartbeat, its read of the turn's history) is the episode's, and its report's.
    logging.getLogger("temporalio").setLevel(logging.ERROR)
    return await connect(start_embedded=True, runtime=runtime)


def task_ids(text: str | None) -> list[str] | None:
    """The ids `--tasks` names, each once; None when it is not given (all tasks).
    An empty list, an empty id or one named twice is refused: never a run of every
    task, or an episode counted twice."""
    from durable_agent.evals.tau2 import EvalSetupError

    if text is None:
        return None
    ids = [i.strip() for i in text.split(",")]
    if not any(ids):
        raise EvalSetupError(
            f"--tasks {text!r} names no task: give ids, comma-separated (e.g. 0,4,7), "
            "or leave it out for all"
        )
    if "" in ids:
        raise EvalSetupError(f"--tasks {text!r}: an id is empty (two commas, or one at an end)")
    twice = next((i for n, i in enumerate(ids) if i in ids[:n]), None)
    if twice is not None:
        raise EvalSetupError(f"--tasks {text!r}: task {twice} is named twice; name each once")
    return ids


def writable(folder: Path) -> None:
    """`--report`'s folder exists (made if need be) and takes files, checked before any
    episode runs: a run's reports are never lost at its end."""
    from durable_agent.evals.tau2 import EvalSetupError

    if folder.exists() and not folder.is_dir():
        raise EvalSetupError(f"--report {folder} is a file: give a folder for the reports")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        why = e.strerror or str(e)
        raise EvalSetupError(
            f"--report {folder}: cannot write there ({why}); give a folder you can write to"
        ) from None


def lost(where: str, said: str) -> str:
    """A run that lost its Temporal server (`said`: what the connection said), in one line."""
    return (
        f"the Temporal server ({where}) stopped answering mid-run: {said}; what "
        "finished is kept there: run the same command again once it is back, and the run "
        "goes on where it was"
    )


def _timing(total: dict[str, Any], earlier: int) -> str:
    """`in 68.5 s, 2.61× the plain loop's (per episode; wall 2.55×)`, as far as known."""
    said = ""
    if "turns_seconds" in total:
        said = f" in {total['turns_seconds']:.1f} s"
    if earlier:
        said += f" ({earlier} finished in an earlier run, taken as they were)"
    if "over_floor" in total:
        said += f", {total['over_floor']}× the plain loop's time per episode"
        if total["over_floor_episodes"] < total["episodes"]:
            said += f" (over the {total['over_floor_episodes']} episodes both timed whole)"
        if "over_floor_wall" in total:
            said += f", {total['over_floor_wall']}× its wall time"
    elif "floor_seconds" in total:
        said += "; the plain loop's report has no time per episode: run --plain again"
    if "temporal_over_floor" in total:
        said += f", {total['temporal_over_floor']}× Temporal's floor's (--floor)"
        if "temporal_over_floor_cpu" in total:
            said += f", this process's CPU {total['temporal_over_floor_cpu']}× its"
    return said


async def _tau2_real(args: argparse.Namespace, tasks: list[Any]) -> int:
    """A real model's run: conversations with the benchmark's customer, pass^k."""
    from durable_agent.evals.conversations import RealRun, real_totals, run_conversations
    from durable_agent.evals.run import write_reports
    from durable_agent.runtime.server import ServerUnavailable
    from durable_agent.settings import state_dir

    run = RealRun(args.domain, args.model, args.user_model or args.model, args.trials)
    state = state_dir() / "evals"
    try:
        conn = await _connect()
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    reports = await _on_server(
        conn,
        run_conversations(
            conn.client,
            run,
            tasks,
            state_dir=state,
            concurrency=args.concurrency,
            ui_url=conn.ui_url or "",
        ),
    )
    if reports is None:
        return 1
    total = real_totals(reports, run.trials)
    name = run.id([t.id for t in tasks], state)
    as_json, as_csv = write_reports(reports, args.report / name, total)
    cost = total["cost_usd"]
    print(
        f"{total['passed']}/{total['episodes']} passed, mean reward {total['reward']:.2f}, "
        f"pass^{run.trials} {total[f'pass^{run.trials}']:.2f}; "
        f"agent {total['model_calls']} model calls, "
        f"{total['input_tokens'] + total['output_tokens']} tokens"
        + (f", ${cost:.4f}" if cost is not None else "")
        + f"; customer {total['customer_calls']} model calls, "
        f"{total['customer_input_tokens'] + total['customer_output_tokens']} tokens, "
        f"${total['customer_cost_usd']:.4f}; longest turn {total['longest_history_events']} "
        f"events, {total['longest_history_bytes'] / 1e6:.2f} MB; report: {as_json}, {as_csv}"
    )
    return 0 if total["passed"] == total["episodes"] else 1


async def _replay(args: argparse.Namespace) -> int:
    """An earlier run replayed with another model: one line and exit 1 when it cannot be."""
    from durable_agent.errors import AgentClientError
    from durable_agent.evals.replay import prepared, replay_run, summary, totals
    from durable_agent.evals.run import write_reports
    from durable_agent.evals.tau2 import EvalSetupError
    from durable_agent.settings import state_dir

    try:
        if not 1 <= args.concurrency <= 64:
            raise EvalSetupError("--concurrency: give 1 to 64")
        writable(args.report)
        prepared(args.run, args.model, state_dir() / "evals")  # before any server is asked
        conn = await _connect()
    except (EvalSetupError, AgentClientError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    replayed = await _on_server(
        conn,
        replay_run(
            conn.client,
            args.run,
            args.model,
            state_dir=state_dir() / "evals",
            concurrency=args.concurrency,
            ui_url=conn.ui_url or "",
        ),
        AgentClientError,
        EvalSetupError,
    )
    if replayed is None:
        return 1
    name, reports = replayed
    total = totals(reports)
    as_json, as_csv = write_reports(reports, args.report / name, total)
    print(f"{summary(total)}; report: {as_json}, {as_csv}")
    return 0 if total["passed"] == total["episodes"] else 1


async def _agentdojo(args: argparse.Namespace) -> int:
    """AgentDojo's suite: every episode scored by its own checks; the last line says it."""
    from durable_agent.evals import agentdojo
    from durable_agent.evals.chaos import ChaosError, kill_every
    from durable_agent.evals.tau2 import EvalSetupError
    from durable_agent.runtime.server import ServerUnavailable
    from durable_agent.settings import state_dir

    try:
        if not 1 <= args.concurrency <= 64:
            raise EvalSetupError("--concurrency: give 1 to 64")
        if args.chaos and args.plain:
            raise EvalSetupError("--chaos kills a durable run's workers: the plain loop has none")
        if args.chaos:
            kill_every()  # a bad AGENT_EVALS_KILL_EVERY is said before anything runs
        agentdojo.check_model(args.model, chaos=args.chaos)
        writable(args.report)
        eps = agentdojo.episodes(
            args.dojo,
            task_ids(args.tasks),
            task_ids(args.injections),
            None if args.attack == "none" else args.attack,
        )
    except (EvalSetupError, agentdojo.AgentDojoSetupError, ChaosError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plain:
        results = await agentdojo.plain_run(eps, args.model)
    else:
        try:
            conn = await _connect()
        except ServerUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        work = agentdojo.run_suite(
            conn.client,
            args.dojo,
            eps,
            model=args.model,
            approve=args.approve,
            concurrency=args.concurrency,
            store=state_dir() / "evals",
            chaos=args.chaos,
        )
        found = await _on_server(conn, work, ChaosError)
        if found is None:
            return 1
        results = found
    total = agentdojo.summary(args.dojo, results)
    how = "plain" if args.plain else args.approve
    model = re.sub(r"[^\w.-]+", "_", args.model)  # a spec may hold ':' or '/'
    name = f"agentdojo-{args.dojo}-{model}-{how}-{len(eps)}"
    as_json = args.report / f"{name}.json"
    as_json.write_text(
        json.dumps({"total": total, "episodes": [vars(r) for r in results]}, indent=2)
    )
    print(f"injected writes by layer: {total['injected_writes_by_layer']}; report: {as_json}")
    print(("plain loop, " if args.plain else "") + agentdojo.line(total))
    return 0


async def _questions(args: argparse.Namespace) -> int:
    import csv

    from durable_agent.backends import default_models
    from durable_agent.evals.questions import TABLES, rows, run_questions, summary
    from durable_agent.runtime.server import ServerUnavailable
    from durable_agent.settings import state_dir

    kinds = default_models().kinds
    if args.model.partition(":")[0] not in kinds:
        print(f"error: --model {args.model!r}: use one of {', '.join(kinds)}", file=sys.stderr)
        return 2
    from durable_agent.evals.tau2 import EvalSetupError

    try:
        writable(args.report)
    except EvalSetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        conn = await _connect()
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    state = state_dir() / "evals"
    work = run_questions(conn.client, TABLES[args.table], model=args.model, state_dir=state)
    reports = await _on_server(conn, work)
    if reports is None:
        return 1
    total = summary(reports)
    name = f"questions-{args.table}-{args.model.replace(':', '_').replace('/', '_')}"
    args.report.mkdir(parents=True, exist_ok=True)
    as_json, as_csv = args.report / f"{name}.json", args.report / f"{name}.csv"
    as_json.write_text(json.dumps({"cases": rows(reports), "total": total}, indent=2))
    with as_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows(reports)[0]) if reports else ["case"])
        writer.writeheader()
        writer.writerows(rows(reports))
    for r in sorted(reports, key=lambda r: r.case):
        if not r.passed:
            print(f"FAIL {r.question!r}: {r.problems}")
    print(
        f"{total['passed']}/{total['cases']} passed ({total['calls_ok']} with the expected "
        f"calls, {total['facts_ok']} with the expected facts); {total['model_calls']} model "
        f"calls; report: {as_json}, {as_csv}"
    )
    return 0 if total["passed"] == total["cases"] else 1


if __name__ == "__main__":
    # The SDK's threads end before the interpreter does (`runtime.runtimes`, at exit).
    raise SystemExit(main())
