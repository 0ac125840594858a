"""The other workers of a task queue, and whether they serve the same agents as this one.

Two workers that serve different definitions of one agent name on one task queue
answer its turns each their own way: unversioned, a turn's workflow tasks go to
either, and one replaying the other's history can fail it. A starting worker says so
in one line, naming both fingerprints.

How a worker knows what the others serve: its identity, which the server lists for
every poller of the queue, names the agents it serves and their fingerprints:

    4242@host agents[bookstore=1a2b3c4d5e6f,desk=9f8e7d6c5b4a]

That needs no record of its own to write, keep or clean up (a poller is listed only
while it polls; a stopped worker's heartbeat says it is gone), works the same with
worker versioning on or off, and costs one DescribeTaskQueue call (and one
ListWorkers) at start. The identity also shows in the Web UI's workers tab and on
the events of the tasks a worker ran, where the agents' fingerprints say which
definition ran them. It is capped at `IDENTITY_CHARS`: agents past the cap are
counted (`+3`), not compared.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from temporalio.client import Client

from durable_agent.runtime.turns import live_identities

log = logging.getLogger("durable_agent.peers")

IDENTITY_CHARS = 255
"""Well within what the server takes for an identity."""
_SERVED = re.compile(r" agents\[([^\]]*)\]\Z")


def identity(base: str, agents: Mapping[str, str]) -> str:
    """`base` (the client's, `pid@host`) with the agents it serves and their
    fingerprints, as many as fit; the rest counted."""
    entries = [f"{name}={fingerprint}" for name, fingerprint in sorted(agents.items())]
    room = IDENTITY_CHARS - len(f"{base} agents[,+{len(entries)}]")
    listed: list[str] = []
    for entry in entries:
        if len(",".join([*listed, entry])) > room:
            break
        listed.append(entry)
    left = len(entries) - len(listed)
    return f"{base} agents[{','.join([*listed, f'+{left}'] if left else listed)}]"


def base_of(identity: str) -> str:
    """An identity without the agents (`pid@host`): the process's own."""
    return _SERVED.sub("", identity)


def served_by(identity: str) -> dict[str, str]:
    """The agents (name: fingerprint) an identity says its worker serves."""
    found = _SERVED.search(identity)
    if found is None:
        return {}
    entries = (e.partition("=") for e in found.group(1).split(","))
    return {name: fingerprint for name, eq, fingerprint in entries if eq}


@dataclass(frozen=True)
class Rival:
    """A live worker that serves an agent of this one's name with another definition."""

    agent: str
    fingerprint: str
    worker: str
    """Its identity, without the agents."""
    seen: datetime


async def rivals(client: Client, task_queue: str, mine: Mapping[str, str]) -> list[Rival]:
    """The live workers of `task_queue` that serve one of `mine` (name: fingerprint)
    with another fingerprint."""
    found = []
    for who, seen in sorted((await live_identities(client, task_queue)).items()):
        for name, fingerprint in served_by(who).items():
            if name in mine and fingerprint != mine[name]:
                found.append(Rival(name, fingerprint, _SERVED.sub("", who), seen))
    return found


def warn(rival: Rival, mine: Mapping[str, str], task_queue: str, versioning: bool) -> None:
    """One line: what serves the agent, both fingerprints, and what to do."""
    ago = (datetime.now(timezone.utc) - rival.seen).total_seconds()
    then = (
        "each version finishes the turns it started, and new turns go to the current one "
        "(client.py versions); unless this is a new release, give this worker a task "
        "queue of its own (--task-queue)"
        if versioning
        else "its turns may run on either, and one may fail the other's. Serve one "
        "definition per task queue: stop one of them, or give this worker a task queue of "
        "its own (--task-queue)"
    )
    log.warning(
        "agent %r: another worker on task queue %r (%s, seen %.0f s ago) serves another "
        "definition of it (fingerprint %s; this worker's: %s): %s",
        rival.agent,
        task_queue,
        rival.worker,
        max(ago, 0.0),
        rival.fingerprint,
        mine[rival.agent],
        then,
    )
