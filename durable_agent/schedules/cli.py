"""`durable-agent schedule add | list | show | pause | resume | trigger | delete`.

    durable-agent schedule add NAME --agent A (--cron EXPR | --every 1h | --at TIME)
        [--customer ID] [--context JSON] [--time-zone TZ] [--overlap skip|...]
        [--catchup 1h] [--model SPEC] [--paused] "QUESTION"

A mistake is one line and exit code 1, as with every other command."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import TYPE_CHECKING

from durable_agent.errors import InvalidContext
from durable_agent.runtime.cli import model_spec, whole_number
from durable_agent.schedules._schedules import MAX_LISTED, ScheduleInfo
from durable_agent.schedules._when import OVERLAPS, _said, duration
from durable_agent.types import DEFAULT_CUSTOMER

if TYPE_CHECKING:
    from durable_agent.client import AgentClient

ACTIONS = ("add", "list", "show", "pause", "resume", "trigger", "delete")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """The `schedule` command and its own commands, under `sub`."""
    schedule = sub.add_parser("schedule", help="schedules that ask an agent on a cron or interval")
    actions = schedule.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="a schedule that asks QUESTION at its times")
    add.add_argument("name", metavar="NAME", help="the schedule's name (its id)")
    add.add_argument("question", metavar="QUESTION", help="what each of its turns asks")
    add.add_argument(
        "--agent", default="", help="the agent that answers (default: the worker's first)"
    )
    add.add_argument("--customer", default=DEFAULT_CUSTOMER, help="default: %(default)s")
    times = add.add_mutually_exclusive_group(required=True)
    times.add_argument("--cron", metavar="EXPR", help="e.g. '0 9 * * MON' (in --time-zone)")
    times.add_argument("--every", metavar="DURATION", help="e.g. 30s, 15m, 1h30m, 2d")
    times.add_argument(
        "--at", metavar="TIME", help="once, e.g. 2026-12-07T09:00 (in --time-zone, else UTC)"
    )
    add.add_argument("--time-zone", default="", metavar="TZ", help="IANA name, e.g. Europe/Berlin")
    add.add_argument(
        "--overlap",
        default="skip",
        choices=list(OVERLAPS),
        help="when a turn is due while the last one runs (default: %(default)s)",
    )
    add.add_argument(
        "--catchup",
        metavar="DURATION",
        help="how late a turn the server missed may still start (default: one interval)",
    )
    add.add_argument("--context", metavar="JSON", help="the turns' context, a JSON object")
    add.add_argument("--model", default="", type=model_spec, help="default: the agent's")
    add.add_argument("--paused", action="store_true", help="add it paused (resume starts it)")
    lst = actions.add_parser("list", help="the schedules of turns, one line each")
    lst.add_argument(
        "--limit", type=whole_number(1, MAX_LISTED), default=100, help="default: %(default)s"
    )
    for action, what in (
        ("show", "a schedule: its turn, times, policy and recent turns"),
        ("pause", "start no more turns until resume"),
        ("resume", "start turns at its times again"),
        ("trigger", "start a turn now (its overlap policy holds)"),
        ("delete", "remove it (its turns stay)"),
    ):
        one = actions.add_parser(action, help=what)
        one.add_argument("name", metavar="NAME")
        if action in ("pause", "resume"):
            one.add_argument("--note", default="", help="why, for the record")
    return schedule


async def run(agents: AgentClient, args: argparse.Namespace) -> int:
    """Do what `args.action` says; print it."""
    schedules = agents.schedules
    if args.action == "add":
        info = await schedules.add(
            args.name,
            args.question,
            agent=args.agent.strip(),
            customer=args.customer,
            every=args.every,
            cron=args.cron,
            at=args.at,
            time_zone=args.time_zone.strip(),
            overlap_policy=args.overlap,
            catchup_window=None if args.catchup is None else duration(args.catchup, "--catchup"),
            model=args.model,
            context=_context(args.context),
            paused=args.paused,
        )
        print(f"added {line(info)}")
    elif args.action == "list":
        found = await schedules.list(limit=args.limit)
        for info in found:
            print(line(info))
        if not found:
            print("no schedules of turns")
    elif args.action == "show":
        print("\n".join(shown(await schedules.show(args.name))))
    elif args.action == "pause":
        await schedules.pause(args.name, args.note)
        print(f"paused {args.name}: it starts no turns until `schedule resume {args.name}`")
    elif args.action == "resume":
        await schedules.resume(args.name, args.note)
        print(f"resumed {args.name}")
    elif args.action == "trigger":
        await schedules.trigger(args.name)
        print(
            f"triggered {args.name}: a turn starts now, unless its overlap policy holds it "
            f"(see `schedule show {args.name}`)"
        )
    elif args.action == "delete":
        await schedules.delete(args.name)
        print(f"deleted {args.name}; the turns it started stay")
    return 0


def _context(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        given = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise InvalidContext('--context: give a JSON object, e.g. \'{"plan": "pro"}\'') from None
    if not isinstance(given, dict):
        raise InvalidContext('--context: give a JSON object, e.g. \'{"plan": "pro"}\'')
    return given


def line(info: ScheduleInfo) -> str:
    """One schedule, one line."""
    zone = f" ({info.time_zone})" if info.time_zone else ""
    state = "paused" if info.paused else "active"
    upcoming = _time(info.next_runs[0]) if info.next_runs and not info.paused else "-"
    return (
        f"{info.name}  {info.when}{zone}  {state}  next: {upcoming}  agent: {info.agent or '-'}  "
        f"customer: {info.customer}  {info.question[:80]!r}"
    )


def shown(info: ScheduleInfo) -> list[str]:
    """One schedule, every line of it."""
    state = "paused" if info.paused else "active"
    lines = [
        f"schedule: {info.name} ({state}{': ' + info.note if info.note else ''})",
        f"asks: {info.question!r}",
        f"agent: {info.agent or '(the worker’s first)'}  customer: {info.customer}  "
        f"task queue: {info.task_queue}",
        f"when: {info.when}" + (f" in {info.time_zone}" if info.time_zone else ""),
        f"overlap: {info.overlap}  catch-up window: {_said(info.catchup_window)}",
        "next: " + (", ".join(_time(t) for t in info.next_runs[:3]) or "-"),
        f"turns started: {info.turns_started}  skipped while one ran: {info.skipped}  "
        f"missed: {info.missed}",
    ]
    if info.context:
        lines.append(f"context: {json.dumps(info.context)[:200]}")
    for turn in info.recent_turns:
        lines.append(f"turn: {turn}" + (" (running)" if turn in info.running_turns else ""))
    return lines


def _time(when: datetime) -> str:
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
