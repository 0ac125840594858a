"""Where activities find a turn's conversation: their worker's copy, else the turn's record.

Model calls carry only what is new (`durable_agent/transcript.py`); the other
activities that read the conversation are given a `ConversationRef`. Both read the
worker's copy of the turn's conversation (`Transcripts`, shared by the turn's
activities), and, with no usable copy here (another worker made the previous call,
or this one started since), replay what the model calls were sent from the turn's
history, run by run back to the first: a turn that continued as new carries no
conversation into its next run, so its earlier runs hold the start of it. A call
made as an activity has that in its input; one made as a local activity
(`Agent.model_calls`), whose input the history does not keep, in its result
(`Sent`, in the marker that records it).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pydantic import BaseModel
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.api.history.v1 import HistoryEvent
from temporalio.converter import DataConverter

from durable_agent.conversation import Message, digest_of, referenced, resolved
from durable_agent.errors import ConversationNotRecorded, PayloadUnavailable
from durable_agent.model import Reply
from durable_agent.transcript import RESULTS, ConversationRef, Delta, Transcripts, replay
from durable_agent.types import Observation

MODEL_CALLS = ("plan", "interpret")
"""The activity types whose inputs carry a turn's conversation."""

SCREENING = ("dispatch", "parse_output")
"""The activity types whose results hold tool results as the model reads them."""

LOCAL_ACTIVITY_MARKER = "core_local_activity"
"""The marker by which the SDK records a local activity's result."""


class Sent(BaseModel):
    """What a model call was sent of the conversation (`ModelCallInput`): in the input
    of a call made as an activity, in the result of one made as a local activity."""

    messages: list[Message]
    since: int | None = None
    call: int = 0

    @property
    def delta(self) -> Delta:
        return Delta(call=self.call, since=self.since, messages=self.messages)


class _LocalCall(BaseModel):
    """What the result of a model call made as a local activity holds for the record
    (`PlanOutput`, `InterpretOutput`)."""

    plan: Reply | None = None
    decision: Reply | None = None
    sent: Sent | None = None


class _Screened(BaseModel):
    """What `parse_output`'s result holds that a model call's reference names."""

    observation: Observation


class _Dispatched(BaseModel):
    """What `dispatch`'s result holds that a model call's reference names (the rest of
    it is left undecoded)."""

    parsed: _Screened | None = None


def local_result(event: HistoryEvent) -> tuple[str, list[Payload]] | None:
    """The local activity whose result `event` records (its marker): its type and its
    result's payloads; None for any other event, or a local activity that failed."""
    if not event.HasField("marker_recorded_event_attributes"):
        return None
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "result" not in marker.details:
        return None
    try:
        data: Any = json.loads(marker.details["data"].payloads[0].data)
    except (KeyError, IndexError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("activity_type"), str):
        return None
    return data["activity_type"], list(marker.details["result"].payloads)


async def local_model_call(
    event: HistoryEvent, converter: DataConverter
) -> tuple[Delta, Reply] | None:
    """A model call made as a local activity that `event` records (its marker): what it
    was sent and its reply; None for any other event, or a call that failed."""
    local = local_result(event)
    if local is None or local[0] not in MODEL_CALLS:
        return None
    [out] = await converter.decode(local[1], [_LocalCall])
    reply = out.plan or out.decision
    if out.sent is None or reply is None:
        return None
    return out.sent.delta, reply


def turn_key(turn: str) -> str:
    """The key of the running activity's turn in `Transcripts`: the workflow id and the
    turn's first run (`turn`; empty for inputs recorded before turns named it: this run)."""
    info = activity.info()
    return f"{info.workflow_id}/{turn or info.workflow_run_id}"


class Conversations:
    """The conversations a worker's activities read by reference."""

    def __init__(self, transcripts: Transcripts | None = None) -> None:
        self.transcripts = transcripts or Transcripts()

    async def of(self, ref: ConversationRef) -> list[Message]:
        """The conversation `ref` names, with what came after it."""
        before = await self.transcripts.at(
            turn_key(ref.turn), ref.call, lambda: recorded_conversation(through=ref.call)
        )
        return [*before, *ref.after]


RECORD_WAIT_S = 5.0
"""How long an activity waits for a model call made as a local activity to reach the
history: the SDK records it when its workflow task completes, or extends the task at
80 % of its timeout (`WORKFLOW_TASK_TIMEOUT`, 2 s)."""


async def recorded_conversation(*, before: str = "", through: int | None = None) -> list[Message]:
    """The conversation as the running turn's model calls had it, replayed from what
    they were sent, as the turn's history records it: the calls scheduled before
    activity `before` of this run, or those numbered up to `through` (references to
    stored payloads are read from the store as they are decoded).

    With `through`, call `through` must be in the record. A call made as a local
    activity is recorded when its workflow task completes or is extended: an activity
    of the same task that finds no copy of the call's conversation here waits for it
    (`RECORD_WAIT_S`), then raises `ConversationNotRecorded`, which is retried."""
    info = activity.info()
    if not info.workflow_id or not info.workflow_run_id:
        raise RuntimeError("an activity reading the conversation runs for a turn's workflow")
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        deltas = await _recorded_deltas(info.workflow_id, info.workflow_run_id, before, through)
        latest = deltas[-1].call if deltas else 0
        if not through or not latest or latest == through:
            return await whole(replay([], deltas))
        if time.monotonic() >= deadline:
            raise ConversationNotRecorded(
                f"model call {through} of turn {info.workflow_id} is not in its history "
                f"(the latest recorded is call {latest})"
            )
        await asyncio.sleep(0.1)


async def _recorded_deltas(
    workflow_id: str, own_run: str, before: str, through: int | None
) -> list[Delta]:
    """What the turn's model calls were sent, from the start of its conversation."""
    client = activity.client()
    converter = client.data_converter
    deltas: list[Delta] = []
    run_id = own_run
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        found: list[Delta] = []
        previous = ""
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                previous = started.continued_execution_run_id
                continue
            local = await local_model_call(event, converter)
            if local is not None:
                delta = local[0]
            elif event.HasField("activity_task_scheduled_event_attributes"):
                scheduled = event.activity_task_scheduled_event_attributes
                if before and scheduled.activity_id == before and run_id == own_run:
                    break
                if scheduled.activity_type.name not in MODEL_CALLS:
                    continue
                [sent] = await converter.decode(list(scheduled.input.payloads), [Sent])
                delta = sent.delta
            else:
                continue
            if through is not None and delta.call > through:
                break
            found.append(delta)
        deltas = found + deltas
        starts = [i for i, d in enumerate(deltas) if not d.since]
        if starts:
            # The conversation starts here: a turn's first call, or one after compaction.
            return deltas[starts[-1] :]
        run_id = previous
    return deltas


async def whole(messages: list[Message]) -> list[Message]:
    """`messages` with the tool results they carry by reference whole: from this
    worker's copy (`RESULTS`), else from the results of the turn's `dispatch` and
    `parse_output` activities, in its history (`PayloadUnavailable` if not there)."""
    wanted = referenced(messages)
    if not wanted:
        return messages
    info = activity.info()
    texts = RESULTS.found(info.workflow_id or "", wanted)
    if missing := wanted - texts.keys():
        for digest, text in (await _recorded_results(missing)).items():
            RESULTS.add(info.workflow_id or "", digest, text)
            texts[digest] = text
    if missing := wanted - texts.keys():
        raise PayloadUnavailable(
            f"{len(missing)} tool result(s) a model call of turn {info.workflow_id} names "
            "are in none of its dispatch or parse_output results: its history is incomplete"
        )
    return resolved(messages, texts)


async def _recorded_results(wanted: set[str]) -> dict[str, str]:
    """The texts of `wanted` (digests) among the results of the turn's `dispatch` (an
    activity, or a quick read's local activity) and `parse_output` activities, read
    from its runs' histories, the latest first
    (references to stored payloads are read from the store as they are decoded)."""
    info = activity.info()
    if not info.workflow_id:
        return {}
    client = activity.client()
    converter = client.data_converter
    found: dict[str, str] = {}
    run_id = info.workflow_run_id
    while run_id and wanted - found.keys():
        handle = client.get_workflow_handle(info.workflow_id, run_id=run_id)
        dispatches: set[int] = set()
        run_id = ""
        async for event in handle.fetch_history_events():
            observation: Observation | None = None
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                run_id = started.continued_execution_run_id
            elif event.HasField("activity_task_scheduled_event_attributes"):
                scheduled = event.activity_task_scheduled_event_attributes
                if scheduled.activity_type.name == SCREENING[0]:
                    dispatches.add(event.event_id)
            elif event.HasField("activity_task_completed_event_attributes"):
                completed = event.activity_task_completed_event_attributes
                if completed.scheduled_event_id in dispatches:
                    payloads = list(completed.result.payloads)
                    [dispatched] = await converter.decode(payloads, [_Dispatched])
                    observation = dispatched.parsed.observation if dispatched.parsed else None
            elif (local := local_result(event)) is not None and local[0] == SCREENING[0]:
                # A quick read's dispatch, run as a local activity: its marker holds it.
                [dispatched] = await converter.decode(local[1], [_Dispatched])
                observation = dispatched.parsed.observation if dispatched.parsed else None
            elif local is not None and local[0] == SCREENING[1]:
                [screened] = await converter.decode(local[1], [_Screened])
                observation = screened.observation
            if observation is not None and (digest := digest_of(observation.text)) in wanted:
                found[digest] = observation.text
    return found
