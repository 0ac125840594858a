"""The help desk's data: tickets and the status of services, in one SQLite file.

Made and seeded the first time it is opened (`HELPDESK_DB`, default `helpdesk.db`
in the current folder). Tickets belong to the person who opened them: another
person's ticket reads exactly like an unknown one. Opening a ticket is keyed by
the call's idempotency key, so a call that runs again (a worker died after it
wrote) gives back the ticket it opened the first time and opens no second one.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from pydantic import BaseModel

from durable_agent import NotFound

SEED_TICKETS = [
    ("INC-1001", "demo", "VPN drops every few minutes", "in progress", "high", "2026-11-23"),
    ("INC-1002", "demo", "New monitor for desk 4.12", "waiting for parts", "low", "2026-11-20"),
    ("INC-1003", "sam", "Printer on floor 3 jams", "resolved", "normal", "2026-11-19"),
]
SEED_SERVICES = [
    ("email", "operational", ""),
    ("vpn", "degraded", "Some users in the Berlin office see drops; a fix is rolling out."),
    ("wiki", "operational", ""),
    ("payroll", "maintenance", "Down for maintenance on Saturday 06:00-08:00 UTC."),
]


class Ticket(BaseModel):
    ticket_id: str
    title: str
    status: str
    priority: str
    updated: str


class Service(BaseModel):
    service: str
    status: str
    note: str = ""


class Desk:
    """The help desk's records. Opened once per worker (`Agent(deps=Desk.open)`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with self._db() as db:
            db.executescript(
                """
                CREATE TABLE IF NOT EXISTS tickets (ticket_id TEXT PRIMARY KEY,
                    requester TEXT, title TEXT, status TEXT, priority TEXT, updated TEXT,
                    opened_by_key TEXT UNIQUE);
                CREATE TABLE IF NOT EXISTS services (service TEXT PRIMARY KEY, status TEXT,
                    note TEXT);
                """
            )
            db.executemany(
                "INSERT OR IGNORE INTO tickets VALUES (?, ?, ?, ?, ?, ?, NULL)", SEED_TICKETS
            )
            db.executemany("INSERT OR IGNORE INTO services VALUES (?, ?, ?)", SEED_SERVICES)

    @classmethod
    def open(cls) -> Desk:
        return cls(os.environ.get("HELPDESK_DB", "helpdesk.db"))

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db, db:
            yield db

    def ticket(self, requester: str, ticket_id: str) -> Ticket:
        with self._db() as db:
            row = db.execute(
                "SELECT ticket_id, title, status, priority, updated FROM tickets "
                "WHERE ticket_id = ? AND requester = ?",
                (ticket_id.upper(), requester),
            ).fetchone()
        if row is None:
            raise NotFound(f"No ticket {ticket_id.upper()} of yours. Please check the ticket id.")
        return Ticket(**dict(zip(Ticket.model_fields, row, strict=True)))

    def service(self, name: str) -> Service:
        with self._db() as db:
            row = db.execute(
                "SELECT service, status, note FROM services WHERE service = ?", (name.lower(),)
            ).fetchone()
        if row is None:
            known = ", ".join(self.services())
            raise NotFound(f"No service called {name!r}. Known services: {known}.")
        return Service(service=row[0], status=row[1], note=row[2])

    def services(self) -> list[str]:
        with self._db() as db:
            return [r[0] for r in db.execute("SELECT service FROM services ORDER BY service")]

    def open_ticket(self, requester: str, title: str, priority: str, key: str) -> Ticket:
        """A new ticket; the ticket this key opened already, if it did (one write per call)."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            done = db.execute(
                "SELECT ticket_id FROM tickets WHERE opened_by_key = ?", (key,)
            ).fetchone()
            if done is None:
                (count,) = db.execute("SELECT COUNT(*) FROM tickets").fetchone()
                ticket_id = f"INC-{1001 + count}"
                db.execute(
                    "INSERT INTO tickets VALUES (?, ?, ?, 'new', ?, date('now'), ?)",
                    (ticket_id, requester, title, priority, key),
                )
            else:
                (ticket_id,) = done
        return self.ticket(requester, ticket_id)

    def tickets_opened(self, requester: str) -> int:
        with self._db() as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM tickets WHERE requester = ? AND opened_by_key IS NOT NULL",
                (requester,),
            ).fetchone()
        return int(count)
