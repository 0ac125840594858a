"""`AgentClient.schedules`: schedules of turns, kept by the Temporal server.

A schedule is a Temporal Schedule whose action starts an ordinary turn: the same
workflow, input, summary, memo and search attributes as `AgentClient.start` builds, so
the turn keeps its limits, consent, story and cost. The server starts each turn, so a
schedule survives worker restarts and deploys, and its turns run on whichever worker
serves the task queue then.

Ids: a schedule's id is its name. Its turns' ids are `sched-<customer>-<name>-<time>`:
the action's id (`turns.workflow_id("sched", customer, name)`, its parts escaped) to
which Temporal appends the scheduled time (`2026-12-07T09:00:00Z`), so each turn has
an id of its own, and none equals a `turn-…` or `chat-…` id. Owner checks (`turn_for`)
read the customer the turn was started for, never the id.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecution,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleState,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from durable_agent.agents import AGENT_NAME_PATTERN
from durable_agent.errors import (
    AgentClientError,
    InvalidSchedule,
    ScheduleNameTaken,
    ServerLost,
    UnknownSchedule,
)
from durable_agent.model_settings import ModelSettings
from durable_agent.runtime import search as registered
from durable_agent.runtime import turns
from durable_agent.schedules._when import (
    catchup_of,
    check_name,
    overlap,
    overlap_name,
    policy,
    when,
)
from durable_agent.types import DEFAULT_CUSTOMER, TurnInput, TurnLimits
from durable_agent.workflows import names, search

if TYPE_CHECKING:
    from durable_agent.client import AgentClient

SCHEDULE_MEMO = "agent_schedule"
"""The schedule's memo entry: how it was asked for (`every 1h`, `cron …`), as the
server keeps a cron expression only as the calendar it makes of it."""
MAX_LISTED = 1000
"""`list`: schedules described at most."""
TURN = "AgentTurn"


def scheduled_turn_id(customer_id: str, name: str) -> str:
    """The id of a schedule's action; each turn's id is this, `-`, its scheduled time."""
    return turns.workflow_id("sched", customer_id, name)


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule of turns, as the server describes it now."""

    name: str
    question: str
    agent: str
    customer: str
    when: str
    """`every 1h`, `cron 0 9 * * MON`, `at 2026-12-07T09:00:00+01:00`."""
    time_zone: str
    """IANA name of the zone cron and at are read in (empty: UTC)."""
    overlap: str
    """What a turn due while the previous one runs does: skip, buffer-one, ..."""
    catchup_window: timedelta
    """How late a turn missed while the server was down may still start."""
    paused: bool
    note: str
    task_queue: str
    context: dict[str, Any] = field(default_factory=dict)
    next_runs: list[datetime] = field(default_factory=list)
    recent_turns: list[str] = field(default_factory=list)
    """Workflow ids of the turns it started lately, oldest first."""
    running_turns: list[str] = field(default_factory=list)
    turns_started: int = 0
    skipped: int = 0
    """Turns not started because the previous one still ran (overlap skip)."""
    missed: int = 0
    """Turns not started because they were later than the catch-up window."""


class Schedules:
    """Add, list, show, pause, resume, trigger and delete schedules of turns
    (`AgentClient.schedules`). Errors: `InvalidSchedule`, `ScheduleNameTaken`,
    `UnknownSchedule`, and the client's own (`InvalidContext`, ...), one line each."""

    def __init__(self, agents: AgentClient) -> None:
        self._agents = agents
        self._temporal = _inline(agents.temporal)

    async def add(
        self,
        name: str,
        question: str,
        *,
        agent: str = "",
        customer: str = DEFAULT_CUSTOMER,
        every: str | timedelta | None = None,
        cron: str | None = None,
        at: str | datetime | None = None,
        time_zone: str = "",
        overlap_policy: str = "skip",
        catchup_window: timedelta | None = None,
        model: str | Sequence[str] = "",
        limits: TurnLimits | None = None,
        context: dict[str, Any] | None = None,
        settings: ModelSettings | Mapping[str, Any] | None = None,
        paused: bool = False,
    ) -> ScheduleInfo:
        """A schedule named `name` that asks `question` of `agent` for `customer` at the
        times of exactly one of `every` (`30s`, `1h30m`, `2d`, a timedelta), `cron`
        (`0 9 * * MON`, in `time_zone`) or `at` (one time: ISO 8601, naive in
        `time_zone`, else UTC). `overlap_policy`: what a turn due while the last one runs
        does (`skip`, default; `buffer-one`, `buffer-all`, `allow-all`, `cancel-other`,
        `terminate-other`). `catchup_window`: how late a turn the server missed (it was
        down) may still start (default: one interval; `at`: a day). The rest is what
        `start` takes, checked as `start` checks it."""
        name = check_name(name)
        if agent and not (isinstance(agent, str) and re.fullmatch(AGENT_NAME_PATTERN, agent)):
            raise InvalidSchedule(
                f"agent {str(agent)[:60]!r}: give the name of an agent the workers serve "
                "(letters, digits, '_', '.', '-')"
            )
        chosen = when(every=every, cron=cron, at=at, time_zone=time_zone)
        rules = policy(chosen, overlap(overlap_policy), catchup_window)
        turn = self._agents.turn_input(
            question,
            agent=agent,
            customer=customer,
            model=model,
            limits=limits,
            context=context,
            settings=settings,
        )
        with _plainly(name):
            # Found by schedule only where the namespace has the attributes (as `start`).
            attributes = TypedSearchAttributes.empty
            if await registered.available(self._agents.temporal):
                at_start = search.at_start(
                    turn.customer_id, turn.model, agent=turn.agent, principal=turn.principal
                )
                attributes = TypedSearchAttributes(
                    [*at_start.search_attributes, SearchAttributePair(search.SCHEDULE, name)]
                )
            action = ScheduleActionStartWorkflow(
                names.TURN,
                turn,
                id=scheduled_turn_id(turn.customer_id, name),
                task_queue=self._agents.task_queue,
                typed_search_attributes=attributes,
                **turns.start_options(turn),
            )
            state = ScheduleState(
                paused=paused, limited_actions=chosen.once, remaining_actions=int(chosen.once)
            )
            memo = {SCHEDULE_MEMO: chosen.text}
            try:
                handle = await self._temporal.create_schedule(
                    name,
                    Schedule(action=action, spec=chosen.spec, policy=rules, state=state),
                    memo=memo,
                )
            except ScheduleAlreadyRunningError:
                raise ScheduleNameTaken(name) from None
            if catchup_window is None and chosen.interval is None and not chosen.once:
                await _one_interval(handle)
            return await self._info(name, await handle.describe())

    async def list(self, limit: int = 100) -> list[ScheduleInfo]:
        """The schedules of turns in the namespace, by name (at most `limit`). A schedule
        just added may take a moment to be listed (the server's listing lags)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LISTED:
            raise InvalidSchedule(f"limit: give 1 to {MAX_LISTED}, not {limit!r}")
        names: list[str] = []
        with _plainly():
            async for entry in await self._temporal.list_schedules():
                listed = entry.schedule.action if entry.schedule else None
                if getattr(listed, "workflow", None) == TURN:
                    names.append(entry.id)
                    if len(names) >= limit:
                        break
        found = await asyncio.gather(*(self._show_if_there(n) for n in sorted(names)))
        return [info for info in found if info is not None]

    async def show(self, name: str) -> ScheduleInfo:
        """The schedule `name`: its turn, times, policy, state and recent turns."""
        name = _named(name)
        with _plainly(name):
            return await self._info(name, await self._handle(name).describe())

    async def pause(self, name: str, note: str = "") -> None:
        """Start no more turns until `resume` (turns running go on)."""
        handle = await self._ours(name)
        with _plainly(name):
            await handle.pause(note=_note(note, "paused"))

    async def resume(self, name: str, note: str = "") -> None:
        """Start turns at the schedule's times again (none for the times it was paused)."""
        handle = await self._ours(name)
        with _plainly(name):
            await handle.unpause(note=_note(note, "resumed"))

    async def trigger(self, name: str) -> None:
        """Start a turn now, as at one of its times (its overlap policy holds: with
        `skip`, none starts while its last turn runs). Paused or not."""
        handle = await self._ours(name)
        with _plainly(name):
            await handle.trigger()

    async def delete(self, name: str) -> None:
        """Remove the schedule; the turns it started stay, and running ones go on."""
        handle = await self._ours(name)
        with _plainly(name):
            await handle.delete()

    def _handle(self, name: str) -> ScheduleHandle:
        return self._temporal.get_schedule_handle(name)

    async def _ours(self, name: str) -> ScheduleHandle:
        """The schedule's handle, once it is known to be a schedule of turns."""
        await self.show(name)
        return self._handle(name)

    async def _show_if_there(self, name: str) -> ScheduleInfo | None:
        try:
            return await self.show(name)
        except UnknownSchedule:  # deleted since it was listed
            return None

    async def _info(self, name: str, desc: ScheduleDescription) -> ScheduleInfo:
        action = desc.schedule.action
        if not isinstance(action, ScheduleActionStartWorkflow) or action.workflow != TURN:
            raise UnknownSchedule(name)  # some other application's schedule
        try:
            [turn] = await self._temporal.data_converter.decode(list(action.args), [TurnInput])
        except Exception as e:  # another key, or a workflow of that name of another's
            said = " ".join(str(e).split())[:200]
            raise AgentClientError(
                f"schedule {name!r}: its turn's input cannot be read here ({said})"
            ) from None
        try:
            asked = str(await desc.memo_value(SCHEDULE_MEMO, type_hint=str))
        except (KeyError, ValueError, TypeError):
            asked = ""
        rules, state, info = desc.schedule.policy, desc.schedule.state, desc.info
        return ScheduleInfo(
            name=name,
            question=turn.question,
            agent=turn.agent,
            customer=turn.customer_id,
            when=asked,
            time_zone=desc.schedule.spec.time_zone_name or "",
            overlap=overlap_name(rules.overlap),
            catchup_window=rules.catchup_window or timedelta(0),
            paused=state.paused,
            note=state.note or "",
            task_queue=action.task_queue,
            context=dict(turn.context),
            next_runs=list(info.next_action_times),
            recent_turns=_started([a.action for a in info.recent_actions]),
            running_turns=_started(info.running_actions),
            turns_started=info.num_actions,
            skipped=info.num_actions_skipped_overlap,
            missed=info.num_actions_missed_catchup_window,
        )


def _started(actions: Sequence[ScheduleActionExecution]) -> list[str]:
    """The workflow ids of the turns a schedule's actions started."""
    return [a.workflow_id for a in actions if isinstance(a, ScheduleActionExecutionStartWorkflow)]


def _inline(client: Client) -> Client:
    """`client`, storing no payload in the payload store: the server's own scheduler
    reads a schedule's action and memo, and it cannot follow a reference to the store
    (the schedule would fail there). A turn's input is bounded (question, context), so
    it travels inline; its codec (encryption) stays."""
    converter = client.data_converter
    if converter.external_storage is None:
        return client
    config = client.config()
    config["data_converter"] = dataclasses.replace(converter, external_storage=None)
    return Client(**config)


async def _one_interval(handle: ScheduleHandle) -> None:
    """A cron schedule's catch-up window: one interval, as the server computes its
    times (until this update, the window is the floor: it catches up less, never more)."""
    window = catchup_of(list((await handle.describe()).info.next_action_times))
    if window is None:
        return

    def updated(given: ScheduleUpdateInput) -> ScheduleUpdate:
        schedule = given.description.schedule
        schedule.policy.catchup_window = window
        return ScheduleUpdate(schedule=schedule)

    await handle.update(updated)


MAX_NOTE_CHARS = 500


def _note(note: str, default: str) -> str:
    note = " ".join(str(note).split())
    if len(note) > MAX_NOTE_CHARS:
        raise InvalidSchedule(f"note: give at most {MAX_NOTE_CHARS} characters")
    return note or f"{default} through durable-agent"


def _named(name: str) -> str:
    """A name to look up: an ill-formed one names no schedule of turns."""
    try:
        return check_name(name)
    except InvalidSchedule:
        raise UnknownSchedule(str(name)[:64]) from None


@contextlib.contextmanager
def _plainly(name: str = "") -> Iterator[None]:
    """What the server says about a schedule, as the client error it means."""
    try:
        yield
    except AgentClientError:
        raise
    except RPCError as e:
        said = " ".join(e.message.split())[:300]
        if e.status == RPCStatusCode.NOT_FOUND and name:
            raise UnknownSchedule(name) from None
        if e.status == RPCStatusCode.INVALID_ARGUMENT:
            raise InvalidSchedule(f"schedule {name!r}: the server refused it ({said})") from None
        if e.status == RPCStatusCode.UNAVAILABLE:
            raise ServerLost(
                f"lost the Temporal server ({said}): try again once it is back", said
            ) from None
        raise AgentClientError(
            f"schedule {name!r}: the Temporal server refused "
            f"({e.status.name if e.status else 'error'}: {said})"
        ) from None
