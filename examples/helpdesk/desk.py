"""The help desk's data: tickets, the status of services, and what the desk charged
people (a repair, a headset), in one SQLite file.

Made and seeded the first time it is opened (`HELPDESK_DB`, default `helpdesk.db`
in the current folder). Tickets belong to the person who opened them, charges to the
tenant and user charged: another person's reads exactly like an unknown one. Opening
a ticket and refunding a charge are keyed by the call's idempotency key, so a call
that runs again (a worker died after it wrote) gives back what it did the first time
and does it no second time. A refund is bounded: never more than what is left of the
charge, nor over `REFUND_LIMIT` at once.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from pydantic import BaseModel

from durable_agent import NotAllowed, NotFound

SEED_TICKETS = [
    ("INC-1001", "demo", "VPN drops every few minutes", "in progress", "high", "2026-11-23"),
    ("INC-1002", "demo", "New monitor for desk 4.12", "waiting for parts", "low", "2026-11-20"),
    ("INC-1003", "sam", "Printer on floor 3 jams", "resolved", "normal", "2026-11-19"),
]
SEED_CHARGES = [  # (charge id, tenant, user, what, cents, date)
    ("CHG-5001", "default", "demo", "Laptop repair", 12000, "2026-11-18"),
    ("CHG-5002", "acme", "ada", "Wireless headset", 8900, "2026-11-21"),
    ("CHG-5003", "globex", "kim", "Docking station", 21000, "2026-11-22"),
]
REFUND_LIMIT = 20000
"""The most one refund gives back, in cents ($200.00)."""
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


class Refund(BaseModel):
    charge_id: str
    refunded: str
    """This refund, in dollars (`45.00`)."""
    charge: str
    """What was charged, in dollars."""
    left: str
    """What is left of the charge after every refund of it."""
    reason: str
    refunded_on: str


def _dollars(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


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
                CREATE TABLE IF NOT EXISTS charges (charge_id TEXT PRIMARY KEY, tenant TEXT,
                    user TEXT, what TEXT, cents INTEGER, charged TEXT);
                CREATE TABLE IF NOT EXISTS refunds (refund_key TEXT PRIMARY KEY,
                    charge_id TEXT, cents INTEGER, reason TEXT, refunded_on TEXT);
                """
            )
            db.executemany("INSERT OR IGNORE INTO charges VALUES (?, ?, ?, ?, ?, ?)", SEED_CHARGES)
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

    def refund(
        self, tenant: str, user: str, charge_id: str, cents: int, reason: str, key: str
    ) -> Refund:
        """Give back `cents` of one of the person's charges; the refund this key made
        already, if it did (one refund per call, however often the call runs)."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")  # one refund at a time: `left` stays true
            charge = db.execute(
                "SELECT cents FROM charges WHERE charge_id = ? AND tenant = ? AND user = ?",
                (charge_id.upper(), tenant, user),
            ).fetchone()
            if charge is None:
                raise NotFound(f"No charge {charge_id.upper()} of yours. Please check its id.")
            (charged,) = charge
            done = db.execute(
                "SELECT cents, reason, refunded_on FROM refunds WHERE refund_key = ?", (key,)
            ).fetchone()
            (given,) = db.execute(
                "SELECT COALESCE(SUM(cents), 0) FROM refunds WHERE charge_id = ?",
                (charge_id.upper(),),
            ).fetchone()
            if done is None:
                if not 0 < cents <= min(REFUND_LIMIT, charged - given):
                    raise NotAllowed(
                        f"Cannot refund {_dollars(cents)} of {charge_id.upper()}: "
                        f"{_dollars(charged - given)} of its {_dollars(charged)} is left to "
                        f"refund, and one refund is at most {_dollars(REFUND_LIMIT)}."
                    )
                db.execute(
                    "INSERT INTO refunds VALUES (?, ?, ?, ?, date('now'))",
                    (key, charge_id.upper(), cents, reason),
                )
                given += cents
                done = (cents, reason, db.execute("SELECT date('now')").fetchone()[0])
        return Refund(
            charge_id=charge_id.upper(),
            refunded=_dollars(done[0]),
            charge=_dollars(charged),
            left=_dollars(charged - given),
            reason=done[1],
            refunded_on=done[2],
        )

    def refunds(self, charge_id: str) -> list[int]:
        """The cents of each refund of a charge, oldest first."""
        with self._db() as db:
            rows = db.execute(
                "SELECT cents FROM refunds WHERE charge_id = ? ORDER BY rowid", (charge_id,)
            )
            return [int(cents) for (cents,) in rows]
