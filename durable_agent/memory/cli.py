"""`durable-agent memory list | export | forget`: a customer's memories, from this
folder's store (the workers' of this state folder); no server is needed.

    durable-agent memory list --customer ID [--tenant T] [--name memory]
    durable-agent memory export --customer ID [--tenant T]      (JSON)
    durable-agent memory forget MEMORY_ID --customer ID [--tenant T]
    durable-agent memory forget MEMORY_ID --customer ID --erase-turn [--conversation]
                   (and erase the turn that told it: `durable-agent erase`; needs the server)
    durable-agent memory list --customer ID --postgres CONNINFO     (a PostgreSQL store)

A mistake is one line and exit code 1, as with every other command."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from functools import partial

from durable_agent.client import AgentClient
from durable_agent.errors import MemoryUnavailable
from durable_agent.memory._access import MemoryAccess
from durable_agent.memory._postgres import PostgresMemoryStore
from durable_agent.principal import DEFAULT_TENANT
from durable_agent.runtime.server import connect


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """The `memory` command and its own commands, under `sub`."""
    memory = sub.add_parser("memory", help="a customer's memories: list, export, forget")
    actions = memory.add_subparsers(dest="action", required=True)
    lst = actions.add_parser("list", help="the customer's memories, one line each")
    export = actions.add_parser("export", help="the customer's memories as JSON")
    forget = actions.add_parser("forget", help="delete one of the customer's memories")
    forget.add_argument("memory_id", metavar="MEMORY_ID", help="its id, mem_... (from list)")
    forget.add_argument(
        "--erase-turn",
        action="store_true",
        help="also erase the turn that told it (its executions and stored payloads), "
        "where the customer's words stay otherwise",
    )
    forget.add_argument(
        "--conversation",
        action="store_true",
        help="with --erase-turn, for a turn of a conversation: erase the whole conversation",
    )
    for action in (lst, export, forget):
        action.add_argument("--customer", required=True, help="whose memories (their user id)")
        action.add_argument("--tenant", default=DEFAULT_TENANT, help="default: %(default)s")
        action.add_argument(
            "--name", default="memory", help="the store (MemorySettings(name=)); default: memory"
        )
        action.add_argument(
            "--postgres",
            metavar="CONNINFO",
            help="the agents' PostgresMemoryStore (a libpq URL), not this folder's file",
        )
    return memory


async def run(args: argparse.Namespace) -> int:
    """Do what `args.action` says; print it."""
    store = None
    if args.postgres:
        store = partial(PostgresMemoryStore, args.postgres, name=args.name)
    if getattr(args, "conversation", False) and not args.erase_turn:
        print("error: --conversation goes with --erase-turn (what it erases)", file=sys.stderr)
        return 1
    if getattr(args, "erase_turn", False):
        # Only erasing needs the server: the rest reads and writes the store alone.
        conn = await connect()
        try:
            erase = AgentClient(conn.client).erase
            return await _acted(MemoryAccess(args.name, store=store, erase=erase), args)
        finally:
            await conn.aclose()
    return await _acted(MemoryAccess(args.name, store=store), args)


async def _acted(access: MemoryAccess, args: argparse.Namespace) -> int:
    try:
        await _act(access, args)
    except MemoryUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


async def _act(access: MemoryAccess, args: argparse.Namespace) -> None:
    if args.action == "list":
        found = await access.list(args.customer, tenant=args.tenant)
        for m in found:
            day = datetime.fromtimestamp(m.created, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")
            print(f"{m.id}  {day}  {m.text!r}" + (f"  turn: {m.turn}" if m.turn else ""))
        if not found:
            print(f"no memories of customer {args.customer!r} (tenant {args.tenant!r})")
    elif args.action == "export":
        print(json.dumps(await access.export(args.customer, tenant=args.tenant), indent=2))
    else:
        erased = await access.forget(
            args.memory_id,
            customer=args.customer,
            tenant=args.tenant,
            erase_turn=args.erase_turn,
            conversation=args.conversation,
        )
        for run in erased:
            print(run.line())
        print(f"forgot {args.memory_id}")
