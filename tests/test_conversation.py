"""Conversations on the real dev server: each message is its own AgentTurn child
with the conversation's memory; one message at a time; continue-as-new keeps the
memory; an idle conversation ends."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from temporalio.client import WorkflowHandle

from durable_agent.attachments import Attachment
from durable_agent.chat import ConversationInput, ConversationState, Memory
from durable_agent.conversation import AssistantMessage, UserMessage
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.turns import AgentClientError, decide, send, start_chat
from durable_agent.scripted import ScriptedModel
from durable_agent.types import Exchange, Outcome, ToolCall, TurnOutput
from durable_agent.workflows import AgentTurn, Conversation
from tests.conftest import SEED_CASES, Harness, last_result


def echo_model() -> ScriptedModel:
    """Answers each question with how much it was told: 'heard N earlier exchange(s)'."""

    def reply(request: ModelRequest) -> Reply:
        earlier = sum(isinstance(m, AssistantMessage) for m in request.messages)
        return Reply(text=f"{request.question} - heard {earlier} earlier exchange(s)")

    return ScriptedModel(plans=[reply])


async def answer(harness: Harness, turn_id: str) -> TurnOutput:
    handle = harness.client.get_workflow_handle_for(AgentTurn.run, turn_id)
    return await asyncio.wait_for(handle.result(), timeout=30)


async def test_each_message_is_a_turn_with_the_memory(harness: Harness) -> None:
    model = echo_model()
    async with harness.worker(model) as task_queue:
        chat = ConversationInput(model="scripted")
        conversation, first = await start_chat(harness.client, chat, "one", task_queue)
        assert first.turn_id == f"{conversation.id}-1"
        answers = [(await answer(harness, first.turn_id)).answer]
        for text in ("two", "three"):
            accepted = await send(conversation, text)
            answers.append((await answer(harness, accepted.turn_id)).answer)
        state = await settled(conversation)

    assert answers == [
        "one - heard 0 earlier exchange(s)",
        "two - heard 1 earlier exchange(s)",
        "three - heard 2 earlier exchange(s)",
    ]
    assert state.turns == 3 and state.current_turn_id is None
    assert [e.question for e in state.exchanges] == ["one", "two", "three"]
    # The third turn's model saw the conversation as it happened, the question last.
    messages = model.requests[-1][1].messages
    assert messages == [
        UserMessage(text="one"),
        AssistantMessage(text=answers[0]),
        UserMessage(text="two"),
        AssistantMessage(text=answers[1]),
        UserMessage(text="three"),
    ]


async def test_offline_follow_up_names_no_id(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        conversation, first = await start_chat(
            harness.client, ConversationInput(), "Has order 123456 shipped?", task_queue
        )
        shipped = await answer(harness, first.turn_id)
        follow_up = await answer(
            harness, (await send(conversation, "When will it arrive?")).turn_id
        )
        third = await answer(harness, (await send(conversation, "What did it cost?")).turn_id)

    assert shipped.outcome is Outcome.ANSWERED and "123456" in shipped.answer
    # The follow-up resolved to the order the conversation is about.
    calls = [c for s in follow_up.steps for c in s.calls]
    assert calls and all(c.arguments.get("order_id") == "123456" for c in calls)
    assert follow_up.outcome is Outcome.ANSWERED
    assert third.outcome is Outcome.ANSWERED and "123456" in str(
        [c.arguments for s in third.steps for c in s.calls]
    )


async def test_messages_wait_their_turn(harness: Harness) -> None:
    waits = ToolCall(
        id="c1", name="start_return", arguments={"order_id": "123456", "reason": "broken"}
    )

    def answer_or_echo(request: ModelRequest) -> Reply:
        if request.question.startswith("Return"):
            return Reply(calls=[waits])
        return Reply(text=f"{request.question}: after {len(request.messages) // 2} exchange(s)")

    model = ScriptedModel(
        plans=[answer_or_echo], decisions=[lambda req: Reply(text=last_result(req))]
    )
    async with harness.worker(model) as task_queue:
        conversation, first = await start_chat(
            harness.client, ConversationInput(model="scripted"), "Return 123456", task_queue
        )
        # The first turn waits for approval; the next message waits its turn.
        second = asyncio.create_task(send(conversation, "hello?"))
        await asyncio.sleep(1.5)
        assert not second.done()
        with pytest.raises(AgentClientError, match="the question is empty"):
            await send(conversation, "   ")
        await decide(harness.client, first.turn_id, None, approved=False, by="customer")
        accepted = await asyncio.wait_for(second, timeout=20)
        assert accepted.turn == 2
        result = await answer(harness, accepted.turn_id)
    assert result.answer == "hello?: after 1 exchange(s)"


async def test_continue_as_new_keeps_the_memory(harness: Harness) -> None:
    async with harness.worker(echo_model()) as task_queue:
        chat = ConversationInput(model="scripted", max_turns_per_run=2)
        conversation, first = await start_chat(harness.client, chat, "one", task_queue)
        await answer(harness, first.turn_id)
        await answer(harness, (await send(conversation, "two")).turn_id)
        await wait_for_new_run(conversation)
        third = await answer(harness, (await send(conversation, "three")).turn_id)
        state = await conversation.query(Conversation.state)

    assert third.answer == "three - heard 2 earlier exchange(s)"
    assert third.steps  # a real turn
    assert state.turns == 3
    assert third.answer.startswith("three")


async def settled(conversation: WorkflowHandle) -> ConversationState:
    """Its state once it has taken in its last turn's answer: a turn ends before the
    conversation's next workflow task records it."""
    deadline = time.monotonic() + 20
    while (state := await conversation.query(Conversation.state)).current_turn_id:
        assert time.monotonic() < deadline, f"turn {state.current_turn_id} never ended"
        await asyncio.sleep(0.05)
    return state


async def wait_for_new_run(conversation: WorkflowHandle, first_run: str = "") -> None:
    """Until the conversation runs in another run than `first_run` (default: the first
    run of its chain, whether or not it has already continued as new)."""
    if not first_run:
        info = (await conversation.describe()).raw_description.workflow_execution_info
        first_run = info.first_run_id
    deadline = time.monotonic() + 20
    while (await conversation.describe()).run_id == first_run:
        assert time.monotonic() < deadline, "no continue-as-new"
        await asyncio.sleep(0.1)


def test_memory_is_bounded_by_count_and_size() -> None:
    exchanges = [Exchange(question=f"q{i}", answer="a" * 100) for i in range(20)]
    assert [e.question for e in Memory(max_exchanges=3).keep(exchanges)] == ["q17", "q18", "q19"]
    assert len(Memory(max_exchanges=20, max_chars=450).keep(exchanges)) == 4
    assert Memory(max_exchanges=0).keep(exchanges) == []

    # Earlier files by reference, the newest first: an older exchange past the bound
    # keeps its words only.
    file = Attachment(name="a.png", content_type="image/png", size=1, sha256="0" * 64, ref="r")
    with_files = [Exchange(question=f"q{i}", answer="a", attachments=[file] * 3) for i in range(3)]
    kept = Memory(max_files=5).keep(with_files)
    assert [len(e.attachments) for e in kept] == [0, 0, 3]
    assert [e.question for e in kept] == ["q0", "q1", "q2"]


async def test_an_idle_conversation_ends(harness: Harness) -> None:
    async with harness.worker(echo_model()) as task_queue:
        chat = ConversationInput(model="scripted", idle_timeout=timedelta(seconds=1))
        conversation, first = await start_chat(harness.client, chat, "hi", task_queue)
        await answer(harness, first.turn_id)
        result = await asyncio.wait_for(conversation.result(), timeout=20)
    assert result["ended_by"] == "idle" if isinstance(result, dict) else result.ended_by == "idle"
    with pytest.raises(AgentClientError):
        await send(conversation, "still there?")


async def test_the_customer_ends_it(harness: Harness) -> None:
    async with harness.worker(echo_model()) as task_queue:
        conversation, first = await start_chat(
            harness.client, ConversationInput(model="scripted"), "hi", task_queue
        )
        await answer(harness, first.turn_id)
        await conversation.signal(Conversation.end)
        handle = harness.client.get_workflow_handle_for(Conversation.run, conversation.id)
        result = await asyncio.wait_for(handle.result(), timeout=20)
    assert result.ended_by == "customer" and result.turns == 1


# Temporal refuses a workflow history over 50 MB or 51,200 events (and warns from
# 10 MB and 10,240) and a payload over 2 MB: a long chat stays a tenth of the warning
# marks or less, in every run and in what it carries over continue-as-new.
FAR_UNDER_BYTES, FAR_UNDER_EVENTS, FAR_UNDER_CARRIED = 1_000_000, 1_024, 200_000


async def test_a_200_message_conversation_stays_far_under_temporals_limits(
    harness: Harness,
) -> None:
    questions = [q for q, _ in SEED_CASES]
    async with harness.worker() as task_queue:
        chat = ConversationInput(stream=True, max_turns_per_run=60)
        conversation, accepted = await start_chat(harness.client, chat, questions[0], task_queue)
        turns = [accepted.turn_id]
        await answer(harness, accepted.turn_id)
        for i in range(1, 100):  # 100 questions and their 100 answers
            accepted = await send(conversation, questions[i % len(questions)])
            turns.append(accepted.turn_id)
            assert (await answer(harness, accepted.turn_id)).outcome is Outcome.ANSWERED
        state = await conversation.query(Conversation.state)
        runs = await history_per_run(harness, conversation.id)

    assert state.turns == 100 and len(runs) == 2  # one continue-as-new, after 60 turns
    for events, size, carried in runs:
        assert events < FAR_UNDER_EVENTS and size < FAR_UNDER_BYTES, (events, size)
        assert carried < FAR_UNDER_CARRIED, carried


async def history_per_run(harness: Harness, workflow_id: str) -> list[tuple[int, int, int]]:
    """(events, bytes, bytes of the run's input) for every run of a workflow, oldest
    first, following the chain of continue-as-new back from the latest run."""
    runs: list[tuple[int, int, int]] = []
    run_id = ""
    while True:
        handle = harness.client.get_workflow_handle(workflow_id, run_id=run_id or None)
        events = [e async for e in handle.fetch_history_events()]
        started = events[0].workflow_execution_started_event_attributes
        runs.insert(0, (len(events), sum(e.ByteSize() for e in events), started.input.ByteSize()))
        run_id = started.continued_execution_run_id
        if not run_id:
            return runs


async def test_a_conversation_of_long_answers_carries_a_bounded_stream(harness: Harness) -> None:
    """Answers of 100,000 characters: the conversation still continues as new, and
    what it carries into its next run (memory, stream) stays bounded by size, not by
    how long its answers were (a run's input is one payload, at most 2 MB)."""

    def long_answer(request: ModelRequest) -> Reply:
        return Reply(text=f"{request.question}: " + "x" * 100_000)

    async with harness.worker(ScriptedModel(plans=[long_answer])) as task_queue:
        chat = ConversationInput(model="scripted", max_turns_per_run=3)
        conversation, accepted = await start_chat(harness.client, chat, "q0", task_queue)
        first_run = (await conversation.describe()).run_id
        await answer(harness, accepted.turn_id)
        for i in (1, 2):
            await answer(harness, (await send(conversation, f"q{i}")).turn_id)
        await wait_for_new_run(conversation, first_run)
        result = await answer(harness, (await send(conversation, "q3")).turn_id)
        runs = await history_per_run(harness, conversation.id)
    assert result.answer.startswith("q3: ") and len(result.answer) == 100_004
    assert len(runs) == 2  # one continue-as-new, after 3 turns of long answers
    assert runs[1][2] < FAR_UNDER_CARRIED, runs[1][2]
