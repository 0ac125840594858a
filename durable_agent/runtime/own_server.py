"""A folder's own Temporal server: the record that lets its commands find it.

The embedded server (and `client.py server`) listens on a free port, so no other
program finds it by chance and none of its own finds a stranger by chance. Its
address is recorded in the state folder (`settings.state_dir()`), and every command
run with that state folder reads it there:

    .durable-agent/server.json   {"address": "127.0.0.1:41517", "ui_port": 41518,
                                  "cluster_id": "…", "db_file": "…/temporal.db"}

A record is only a claim: the port may have been freed and taken since. The server
proves it is the folder's by its cluster id, which Temporal draws at random when it
creates its database and keeps there, so it survives restarts and no other server
has it (`identify`). A record whose server is gone stays, so that the next start
reuses its ports (the Web UI's address stays the same) when they are free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from temporalio.api.workflowservice.v1 import GetClusterInfoRequest
from temporalio.client import Client

RECORD = "server.json"
LOCK = "server.lock"


@dataclass(frozen=True)
class ServerRecord:
    address: str
    """`127.0.0.1:PORT`, where its frontend (gRPC) listens."""
    ui_port: int
    cluster_id: str
    """Its identity (`identify`)."""
    db_file: str = ""
    """Its SQLite file, for the person reading the record."""

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @classmethod
    def read(cls, folder: Path) -> ServerRecord | None:
        """The folder's record; None when there is none, or it cannot be read (a
        record half written by a crash names no server worth trusting)."""
        try:
            raw = json.loads((folder / RECORD).read_text())
            return cls(
                address=str(raw["address"]),
                ui_port=int(raw["ui_port"]),
                cluster_id=str(raw["cluster_id"]),
                db_file=str(raw.get("db_file", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, folder: Path) -> None:
        """Replace the folder's record at once: a reader sees the old one or this one."""
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{RECORD}.{os.getpid()}"
        partial.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(partial, folder / RECORD)


async def identify(client: Client) -> str:
    """The server's cluster id: random per database, the same across restarts."""
    info = await client.workflow_service.get_cluster_info(
        GetClusterInfoRequest(), timeout=timedelta(seconds=10)
    )
    return info.cluster_id


@contextlib.asynccontextmanager
async def folder_lock(folder: Path, *, exclusive: bool) -> AsyncIterator[None]:
    """Held while a process finds or starts the folder's server (`exclusive`), or reads
    the record (shared): two commands started together in one folder then get one
    server, not two on one SQLite file, and a reader waits for a record being written.
    Where there is no `fcntl` (Windows) there is no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    if not exclusive and not folder.exists():
        yield  # nothing recorded, and nothing to create just to read
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a+b") as f:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        # In a thread: another process may hold it while its server starts (seconds).
        await asyncio.to_thread(fcntl.flock, f.fileno(), mode)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
