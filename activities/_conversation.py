"""Where activities find a turn's conversation: their worker's copy, else the turn's record.

Model calls carry only what is new (`durable_agent/transcript.py`); the other
activities that read the conversation are given a `ConversationRef`. Both read the
worker's copy of the turn's conversation (`Transcripts`, shared by the turn's
activities), and, with no usable copy here (another worker made the previous call,
or this one started since), replay the model calls' inputs from the turn's history,
run by run back to the first: a turn that continued as new carries no conversation
into its next run, so its earlier runs hold the start of it.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from durable_agent.conversation import Message
from durable_agent.transcript import ConversationRef, Delta, Transcripts, replay

MODEL_CALLS = ("plan", "interpret")
"""The activity types whose inputs carry a turn's conversation."""


class _Carried(BaseModel):
    """What a model call's input carries of the conversation (`ModelCallInput`)."""

    messages: list[Message]
    since: int | None = None
    call: int = 0


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


async def recorded_conversation(*, before: str = "", through: int | None = None) -> list[Message]:
    """The conversation as the running turn's model calls had it, replayed from their
    inputs in the turn's history: those scheduled before activity `before` of this run,
    or those numbered up to `through` (references to stored payloads are read from the
    store as the inputs are decoded)."""
    info = activity.info()
    if not info.workflow_id:
        raise RuntimeError("an activity reading the conversation runs for a turn's workflow")
    client = activity.client()
    deltas: list[Delta] = []
    run_id = info.workflow_run_id
    while run_id:
        handle = client.get_workflow_handle(info.workflow_id, run_id=run_id)
        found: list[Delta] = []
        previous = ""
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes
                previous = started.continued_execution_run_id
                continue
            if not event.HasField("activity_task_scheduled_event_attributes"):
                continue
            scheduled = event.activity_task_scheduled_event_attributes
            if before and scheduled.activity_id == before and run_id == info.workflow_run_id:
                break
            if scheduled.activity_type.name not in MODEL_CALLS:
                continue
            [earlier] = await client.data_converter.decode(
                list(scheduled.input.payloads), [_Carried]
            )
            if through is not None and earlier.call > through:
                break
            found.append(Delta(call=earlier.call, since=earlier.since, messages=earlier.messages))
        deltas = found + deltas
        starts = [i for i, d in enumerate(deltas) if not d.since]
        if starts:
            # The conversation starts here: a turn's first call, or one after compaction.
            deltas = deltas[starts[-1] :]
            break
        run_id = previous
    return replay([], deltas)
