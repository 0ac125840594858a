"""When a schedule starts its turns, and what it does about overlap and lateness, read
from what a person types (`--every 1h`, `--cron "0 9 * * MON"`, `--at 2026-12-07T09:00`)
into Temporal's `ScheduleSpec` and `SchedulePolicy`. Plain Python: refusals are
`InvalidSchedule`, one line each."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from temporalio.client import (
    ScheduleCalendarSpec,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
)

from durable_agent.errors import InvalidSchedule

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A schedule's name: its id in the namespace, and a part of its turns' ids."""
MIN_EVERY = timedelta(seconds=1)
"""Temporal's own granularity: a schedule acts at most once a second."""
MAX_EVERY = timedelta(days=366)
MAX_CRON_CHARS = 200
MAX_ZONE_CHARS = 100
AT_CATCHUP = timedelta(days=1)
"""How late a one-off (`at`) turn may still start, when the server was down at its time
(it has no interval to go by)."""
MIN_CATCHUP = timedelta(seconds=10)
"""The server's own floor for a catch-up window."""

OVERLAPS = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer-one": ScheduleOverlapPolicy.BUFFER_ONE,
    "buffer-all": ScheduleOverlapPolicy.BUFFER_ALL,
    "allow-all": ScheduleOverlapPolicy.ALLOW_ALL,
    "cancel-other": ScheduleOverlapPolicy.CANCEL_OTHER,
    "terminate-other": ScheduleOverlapPolicy.TERMINATE_OTHER,
}
"""What a schedule does when its previous turn still runs (default: skip this one)."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"(?:[0-9]{1,7}[smhd])+")


@dataclass(frozen=True)
class When:
    """A schedule's times, as Temporal takes them, and as a person reads them back."""

    spec: ScheduleSpec
    text: str
    """`every 1h`, `cron 0 9 * * MON`, `at 2026-12-07T09:00:00+01:00`."""
    interval: timedelta | None
    """The time between two turns, when it is known before the server computes the
    schedule's times (an interval; a one-off has none)."""
    once: bool = False


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidSchedule(
            f"schedule name {str(name)[:60]!r}: give 1 to 64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


def duration(text: str, flag: str = "every") -> timedelta:
    """`30s`, `15m`, `1h30m`, `2d` as a timedelta."""
    given = text.strip().lower() if isinstance(text, str) else ""
    if not _EVERY.fullmatch(given):
        raise InvalidSchedule(
            f"{flag} {str(text)[:60]!r}: give a duration such as 30s, 15m, 1h30m or 2d"
        )
    seconds = sum(int(n) * _UNITS[u] for n, u in re.findall(r"([0-9]+)([smhd])", given))
    return timedelta(seconds=seconds)


def zone(name: str) -> str:
    """A time zone's IANA name (`Europe/Berlin`), checked; empty: UTC."""
    if not name:
        return ""
    if len(name) > MAX_ZONE_CHARS or not name.isprintable():
        raise InvalidSchedule(f"time zone {name[:60]!r}: give an IANA name such as Europe/Berlin")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"time zone {name[:60]!r} is unknown: give an IANA name such as Europe/Berlin or UTC"
        ) from None
    return name


def when(
    *,
    every: str | timedelta | None = None,
    cron: str | None = None,
    at: str | datetime | None = None,
    time_zone: str = "",
    now: datetime | None = None,
) -> When:
    """Exactly one of `every`, `cron` or `at`, in `time_zone` (cron and at only)."""
    given = [k for k, v in (("every", every), ("cron", cron), ("at", at)) if v is not None]
    if len(given) != 1:
        raise InvalidSchedule(
            "give exactly one of every (30s, 1h, 2d), cron ('0 9 * * MON') or at (a time), "
            f"not {' and '.join(given) or 'none'}"
        )
    tz = zone(time_zone)
    if every is not None:
        if tz:
            raise InvalidSchedule(
                "a time zone applies to cron and at; every counts from a fixed point in UTC, "
                "whatever the zone"
            )
        interval = every if isinstance(every, timedelta) else duration(every)
        if not MIN_EVERY <= interval <= MAX_EVERY:
            raise InvalidSchedule(
                f"every {_said(interval)}: give from {_said(MIN_EVERY)} to {_said(MAX_EVERY)}"
            )
        spec = ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)])
        return When(spec, f"every {_said(interval)}", interval)
    if cron is not None:
        expression = " ".join(cron.split()) if isinstance(cron, str) else ""
        if not expression or len(expression) > MAX_CRON_CHARS or not expression.isprintable():
            raise InvalidSchedule(
                f"cron {str(cron)[:60]!r}: give a cron expression such as '0 9 * * MON' "
                f"(at most {MAX_CRON_CHARS} characters)"
            )
        # The server reads the expression (its own cron dialect) and refuses a bad one.
        spec = ScheduleSpec(cron_expressions=[expression], time_zone_name=tz)
        return When(spec, f"cron {expression}", None)
    assert at is not None
    moment = _moment(at, tz)
    if moment <= (now or datetime.now(timezone.utc)):
        raise InvalidSchedule(f"at {moment.isoformat()}: that time has passed; give a later one")
    local = moment.astimezone(ZoneInfo(tz or "UTC"))
    spec = ScheduleSpec(
        calendars=[
            ScheduleCalendarSpec(
                second=[ScheduleRange(local.second)],
                minute=[ScheduleRange(local.minute)],
                hour=[ScheduleRange(local.hour)],
                day_of_month=[ScheduleRange(local.day)],
                month=[ScheduleRange(local.month)],
                year=[ScheduleRange(local.year)],
                day_of_week=[ScheduleRange(0, 6)],
            )
        ],
        time_zone_name=tz,
    )
    return When(spec, f"at {local.isoformat()}", None, once=True)


def _moment(at: str | datetime, tz: str) -> datetime:
    """`at` as an aware time: one without an offset is in `tz` (else UTC)."""
    if isinstance(at, datetime):
        moment = at
    else:
        try:
            moment = datetime.fromisoformat(at.strip())
        except (ValueError, AttributeError):
            raise InvalidSchedule(
                f"at {str(at)[:60]!r}: give a time such as 2026-12-07T09:00 (in the time "
                "zone given, else UTC) or 2026-12-07T09:00+01:00"
            ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=ZoneInfo(tz or "UTC"))
    return moment


def overlap(name: str | ScheduleOverlapPolicy) -> ScheduleOverlapPolicy:
    if isinstance(name, ScheduleOverlapPolicy):
        return name
    try:
        return OVERLAPS[name]
    except (KeyError, TypeError):
        raise InvalidSchedule(
            f"overlap {str(name)[:60]!r}: give one of {', '.join(OVERLAPS)}"
        ) from None


def overlap_name(policy: ScheduleOverlapPolicy) -> str:
    return next((k for k, v in OVERLAPS.items() if v == policy), "skip")


def policy(
    chosen: When, overlap_policy: ScheduleOverlapPolicy, catchup: timedelta | None
) -> SchedulePolicy:
    """Overlap as chosen; catch-up within `catchup`, else one interval (a one-off: a
    day; a cron schedule: set once the server has computed its times, `catchup_of`)."""
    if catchup is not None and not MIN_CATCHUP <= catchup <= MAX_EVERY:
        raise InvalidSchedule(
            f"catch-up window {_said(catchup)}: give from {_said(MIN_CATCHUP)} to "
            f"{_said(MAX_EVERY)}"
        )
    window = catchup or chosen.interval or (AT_CATCHUP if chosen.once else MIN_CATCHUP)
    return SchedulePolicy(overlap=overlap_policy, catchup_window=max(window, MIN_CATCHUP))


def catchup_of(next_times: list[datetime]) -> timedelta | None:
    """One interval of a schedule whose times only the server knows (cron): the
    shortest gap between its next times; None with fewer than two."""
    gaps = [b - a for a, b in zip(next_times, next_times[1:], strict=False) if b > a]
    return max(min(gaps), MIN_CATCHUP) if gaps else None


def _said(d: timedelta) -> str:
    """A duration as `every` takes it: 90 s is 1m30s."""
    seconds = int(d.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"
