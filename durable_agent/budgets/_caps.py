"""Which budgets hold for whom: caps in US dollars per tenant or per user, per UTC day or
month, and the ledger (one workflow) that keeps each budget of each period.

    Budgets.parse("tenant=20/day, tenant:acme=500/month@80%, user=2/day")
    Budgets(caps=(Cap(usd=20, per="day"), Cap(usd=2, per="day", user=True)))
    Budgets.from_env()                         AGENT_BUDGETS (the same text)

`tenant=` caps every tenant, `tenant:NAME=` one tenant (over `tenant=` for the same
period); `user=` caps every user of any tenant, `user:NAME=` every user of tenant NAME.
`@80%` after a cap sets its soft line: a call that would take the period's spend past
80% of the cap waits for a person's approval first, once per turn and period; by default
the asker's (whoever can reach the turn), or, named after it, of the approvers the rules
say (`@80%:role:support-lead`, `@80%:asker|role:support-lead`: the rules of an agent's
`ApprovalPolicy.approvers`).
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal

from durable_agent.approval import rules
from durable_agent.pricing import format_cost
from durable_agent.principal import Principal

SETTING = "AGENT_BUDGETS"

Period = Literal["day", "month"]
PERIODS: tuple[Period, ...] = ("day", "month")
EVERY = "*"
"""A cap's tenant when it holds for every tenant."""

MAX_USER_KEY = 200
"""The longest escaped user a ledger id spells out; a longer one is named by its hash."""

_ITEM = re.compile(
    r"(tenant|user)(?::([a-z0-9][a-z0-9._-]*))?=([0-9.]+)/(day|month)"
    r"(?:@([0-9.]+)%(?::([a-z0-9:._|-]+))?)?"
)


class BudgetSettingError(ValueError):
    """`AGENT_BUDGETS` (or `Budgets.parse`) cannot be read; the message shows the shape."""


@dataclass(frozen=True)
class Cap:
    """At most `usd` US dollars of model calls per UTC `per` (day or month), for each
    tenant (`user=False`) or for each user of a tenant (`user=True`); `tenant`: the
    tenant it holds for (`*`: every one)."""

    usd: float
    per: Period = "day"
    user: bool = False
    tenant: str = EVERY
    soft: float | None = None
    """The soft line, a share of the cap (0.8: 80%): a call that would take the period's
    spend past it waits for a person's approval (None: none)."""
    approvers: str = ""
    """Who may approve going past the soft line, as an agent's approvers say it
    (`role:support-lead`, `asker|role:support-lead`: `ApprovalPolicy.approvers`); empty:
    whoever can reach the turn, its asker, as a call no approvers name."""

    def __post_init__(self) -> None:
        if not self.usd >= 0 or self.per not in PERIODS:
            raise BudgetSettingError(f"a cap of {self.usd!r} per {self.per!r}: {_SHAPE}")
        if self.soft is not None and not 0 < self.soft < 1:
            raise BudgetSettingError(f"a soft line of {self.soft!r} is no share: {_SHAPE}")
        if self.approvers and self.soft is None:
            raise BudgetSettingError(f"approvers {self.approvers!r} need a soft line: {_SHAPE}")
        try:
            self.approver_rules  # noqa: B018  (checked now, not when a turn needs them)
        except ValueError as e:
            raise BudgetSettingError(f"{e}: {_SHAPE}") from None

    @property
    def approver_rules(self) -> list[str]:
        """`approvers` as rules (`["asker", "role:support-lead"]`); empty: anyone."""
        return rules(self.approvers, "the soft line") if self.approvers else []

    @property
    def scope(self) -> str:
        return "user" if self.user else "tenant"


_SHAPE = (
    "use SCOPE[:TENANT]=DOLLARS/PERIOD[@SOFT%[:APPROVERS]], comma-separated, SCOPE tenant "
    "or user, PERIOD day or month (UTC), SOFT a share of the cap that needs a person's "
    "approval to pass, APPROVERS who may give it (asker, role:NAME, joined by |; default: "
    "the asker), e.g. AGENT_BUDGETS=tenant=20/day,tenant:acme=500/month@80%:role:support-lead"
)


@dataclass(frozen=True)
class Held:
    """One budget of one period that a model call counts against."""

    cap: Cap
    ledger: str
    """The ledger workflow's id (`ledger_id`)."""
    ends: datetime
    """When the period ends and the budget resets (UTC)."""
    who: str
    """The budget in words: `the daily budget of tenant acme`."""

    def line(self, spent: float, held: float, worst: float) -> str:
        """Why a call is refused: which budget, what it holds, when it resets."""
        return (
            f"{self.who} ({format_cost(self.cap.usd)}) cannot pay for another model call "
            f"({format_cost(spent)} spent, {format_cost(held)} held by calls under way, "
            f"this one may cost up to {format_cost(worst)}); "
            f"it resets at {self.ends:%Y-%m-%d %H:%M} UTC"
        )

    def past_soft_line(self, spent: float, held: float) -> bool:
        """Whether spent and held (this call's hold among them) pass the soft line."""
        soft = self.cap.soft
        return soft is not None and spent + held > soft * self.cap.usd

    def soft_line(self, spent: float, held: float, worst: float) -> str:
        """What a person is asked before a call passes the soft line."""
        share = f"{self.cap.soft * 100:g}%" if self.cap.soft is not None else ""
        return (
            f"{self.who} ({format_cost(self.cap.usd)}) would pass its soft line of {share} "
            f"with another model call ({format_cost(spent)} spent, {format_cost(held)} held "
            f"by calls under way, this one may cost up to {format_cost(worst)})"
        )


@dataclass(frozen=True)
class Budgets:
    """The caps a worker keeps; none: no budget, and model calls cost nothing extra."""

    caps: tuple[Cap, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Budgets:
        caps = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            m = _ITEM.fullmatch(item.replace(" ", ""))
            soft = None
            approvers = (m.group(6) or "") if m else ""
            try:
                usd = float(m.group(3)) if m else -1.0
                soft = float(m.group(5)) / 100 if m and m.group(5) else None
            except ValueError:
                usd = -1.0
            if m is None or usd < 0 or (soft is not None and not 0 < soft < 1):
                raise BudgetSettingError(f"{SETTING}: {item!r} is no budget; {_SHAPE}")
            scope, tenant, _, per, _, _ = m.groups()
            try:
                cap = Cap(
                    usd,
                    per,  # type: ignore[arg-type]
                    user=scope == "user",
                    tenant=tenant or EVERY,
                    soft=soft,
                    approvers=approvers,
                )
            except BudgetSettingError:
                raise BudgetSettingError(f"{SETTING}: {item!r} is no budget; {_SHAPE}") from None
            caps.append(cap)
        return cls(tuple(caps))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Budgets:
        return cls.parse((os.environ if env is None else env).get(SETTING, ""))

    def __bool__(self) -> bool:
        return bool(self.caps)

    def applies(self, who: Principal) -> bool:
        return any(c.tenant in (EVERY, who.tenant) for c in self.caps)

    def held(self, who: Principal, now: datetime) -> list[Held]:
        """The budgets a call of `who` counts against at `now`: per scope and period,
        the tenant's own cap, else the one for every tenant."""
        chosen: dict[tuple[bool, Period], Cap] = {}
        for cap in self.caps:
            key = (cap.user, cap.per)
            if cap.tenant == who.tenant or (cap.tenant == EVERY and key not in chosen):
                chosen[key] = cap
        return [_held(cap, who, now) for cap in chosen.values()]


def _held(cap: Cap, who: Principal, now: datetime) -> Held:
    start, ends = period_of(cap.per, now)
    label = f"{start:%Y-%m-%d}" if cap.per == "day" else f"{start:%Y-%m}"
    whose = f"user {who.user} of tenant {who.tenant}" if cap.user else f"tenant {who.tenant}"
    daily = "daily" if cap.per == "day" else "monthly"
    user = user_key(who.user) if cap.user else None
    return Held(cap, ledger_id(who.tenant, user, label), ends, f"the {daily} budget of {whose}")


def period_of(per: Period, now: datetime) -> tuple[datetime, datetime]:
    """The UTC day or month holding `now`: its start and its end."""
    now = now.astimezone(timezone.utc)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if per == "day":
        return day, day + timedelta(days=1)
    first = day.replace(day=1)
    return first, (first + timedelta(days=32)).replace(day=1)


def user_key(user: str) -> str:
    """A user as a ledger id spells it: percent-escaped (it never holds a `:`), or, when
    long, `!` and its sha256 (`!` is never part of an escaped user)."""
    escaped = urllib.parse.quote(user, safe="")
    if len(escaped) <= MAX_USER_KEY:
        return escaped
    return "!" + hashlib.sha256(user.encode()).hexdigest()


def ledger_id(tenant: str, user: str | None, period: str) -> str:
    """`budget:t:<tenant>:<period>` or `budget:u:<tenant>:<user>:<period>`: tenants hold
    no `:`, escaped users neither, so no two budgets share a ledger."""
    if user is None:
        return f"budget:t:{tenant}:{period}"
    return f"budget:u:{tenant}:{user}:{period}"
