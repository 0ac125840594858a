"""python -m evals tau2 --domain retail --model oracle [--tasks 0,1,2 | --split base]

Runs τ²-bench tasks as durable episodes (`evals/run.py`) against the Temporal server
the environment names (else localhost:7233, else one this process starts), prints
each episode as it ends and a total, and writes the report as JSON and CSV. Running
the same command again continues the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="suite", required=True)
    t = sub.add_parser("tau2", help="τ²-bench tasks as durable episodes")
    t.add_argument("--domain", default="retail", help="a τ²-bench domain (default: retail)")
    t.add_argument("--model", default="oracle", help="oracle: each task's expected actions")
    which = t.add_mutually_exclusive_group()
    which.add_argument("--tasks", help="task ids, comma-separated (default: all)")
    which.add_argument("--split", help="a task split of the domain (e.g. base)")
    t.add_argument("--concurrency", type=int, default=4, help="episodes at once (default: 4)")
    t.add_argument(
        "--report", type=Path, default=Path("evals-results"), help="where JSON and CSV go"
    )
    args = p.parse_args(argv)
    try:
        return asyncio.run(_tau2(args))
    except KeyboardInterrupt:
        print("stopped: run the same command again to go on", file=sys.stderr)
        return 130


async def _tau2(args: argparse.Namespace) -> int:
    from durable_agent.runtime.server import ServerUnavailable, connect
    from evals import tau2
    from evals.run import run_id, run_tasks, totals, write_reports

    try:
        if args.model != "oracle":
            raise tau2.EvalSetupError(
                f"--model {args.model!r}: only the oracle runs here so far (the benchmark's "
                "user simulator for real models is not wired in yet)"
            )
        if not 1 <= args.concurrency <= 64:
            raise tau2.EvalSetupError("--concurrency: give 1 to 64")
        ids = [i.strip() for i in args.tasks.split(",") if i.strip()] if args.tasks else None
        tasks = tau2.tasks(args.domain, ids, args.split)
        for task in tasks:
            tau2.expected_actions(task)
    except (tau2.EvalSetupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        conn = await connect(start_embedded=True)
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    state = Path(os.environ.get("AGENT_STATE_DIR", ".durable-agent")) / "evals"
    try:
        reports = await run_tasks(
            conn.client,
            args.domain,
            tasks,
            state_dir=state,
            concurrency=args.concurrency,
            ui_url=conn.ui_url or "",
        )
    finally:
        conn.close()
    run = run_id(args.domain, "oracle", [t.id for t in tasks])
    as_json, as_csv = write_reports(reports, args.report / run)
    total = totals(reports)
    print(
        f"{total['passed']}/{total['episodes']} passed; {total['model_calls']} model calls; "
        f"longest turn {total['longest_history_events']} events, "
        f"{total['longest_history_bytes'] / 1e6:.2f} MB; report: {as_json}, {as_csv}"
    )
    return 0 if total["passed"] == total["episodes"] else 1


if __name__ == "__main__":
    sys.exit(main())
