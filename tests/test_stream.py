"""Turn and conversation streams: offsets resume exactly, retried text is replaced,
batches stay bounded, and a turn with streaming on decides as it does with it off."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import Client, Interceptor, OutboundInterceptor, QueryWorkflowInput

from durable_agent.chat import ConversationInput
from durable_agent.errors import ModelUnavailable
from durable_agent.model import ModelRequest, Reply
from durable_agent.runtime.streams import chat_events, turn_events
from durable_agent.runtime.turns import decide, send, start_chat, start_turn
from durable_agent.scripted import ScriptedModel
from durable_agent.stream import (
    ChatEnded,
    DoneEvent,
    Drafts,
    StepEvent,
    TextSink,
    TokenBatcher,
    TokensEvent,
    TurnAnswered,
    TurnEvent,
    TurnStarted,
    write_out,
)
from durable_agent.types import Outcome, TurnInput
from tests.conftest import Harness
from tests.test_approvals import RETURN, awaiting, until
from tests.test_conversation import wait_for_new_run

QUESTION = "Has order 123456 shipped?"


# --- the pieces, without a server --------------------------------------------------


def test_batches_are_bounded_in_time() -> None:
    batcher = TokenBatcher(interval_s=0.1, max_chars=100)
    assert batcher.add("Your ", now=0.0) == []
    assert batcher.add("order ", now=0.05) == []
    assert batcher.add("has ", now=0.1) == ["Your order has "]
    assert batcher.tick(now=0.15) == []
    assert batcher.add("shipped.", now=0.16) == []
    assert batcher.tick(now=0.19) == []
    assert batcher.tick(now=0.2) == ["shipped."]
    assert batcher.flush() == ""


def test_batches_are_bounded_in_size() -> None:
    batcher = TokenBatcher(interval_s=10, max_chars=4)
    assert batcher.add("abcdefghij", now=0.0) == ["abcd", "efgh"]
    assert batcher.flush() == "ij"


def test_a_later_attempt_replaces_the_draft() -> None:
    drafts = Drafts()
    assert drafts.add(TokensEvent(call="3", attempt=1, text="Your ord")) == "started"
    assert drafts.add(TokensEvent(call="3", attempt=2, text="Your ")) == "restarted"
    assert drafts.add(TokensEvent(call="3", attempt=1, text="er has")) == "stale"
    assert drafts.add(TokensEvent(call="3", attempt=2, text="order shipped.")) == "continued"
    assert drafts.add(TokensEvent(call="5", text="Another call.")) == "started"
    assert drafts.text("3") == "Your order shipped."
    assert drafts.text("5") == "Another call."


async def test_write_out_writes_word_by_word() -> None:
    pieces: list[str] = []
    await write_out("Your order  has shipped.", pieces.append, per_word_s=0)
    assert pieces == ["Your ", "order  ", "has ", "shipped."]
    assert "".join(pieces) == "Your order  has shipped."


# --- through a server ---------------------------------------------------------------


async def read_turn(
    harness: Harness, turn_id: str, from_offset: int = 0
) -> list[tuple[int, TurnEvent]]:
    async def read() -> list[tuple[int, TurnEvent]]:
        return [e async for e in turn_events(harness.client, turn_id, from_offset)]

    return await asyncio.wait_for(read(), timeout=30)


async def test_a_turn_streams_its_steps_then_its_answer_as_written(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        handle = await start_turn(
            harness.client, TurnInput(question=QUESTION, stream=True), task_queue
        )
        events = await read_turn(harness, handle.id)
        result = await handle.result()
        # A reader that comes back at an offset gets exactly the rest; a finished
        # turn's stream is still there to read (by query: a worker answers it).
        middle = len(events) // 2
        rest = await read_turn(harness, handle.id, from_offset=middle)

    assert rest == events[middle:]
    offsets = [o for o, _ in events]
    assert offsets == list(range(len(events))), "offsets are consecutive from 0"
    steps = [e.step for _, e in events if isinstance(e, StepEvent)]
    assert [s.model_dump() for s in steps] == [s.model_dump() for s in result.steps]
    done = events[-1][1]
    assert isinstance(done, DoneEvent) and done.answer == result.answer
    tokens = [e for _, e in events if isinstance(e, TokensEvent)]
    assert len(tokens) >= 2, "the answer comes in more than one piece"
    drafts = Drafts()
    for t in tokens:
        drafts.add(t)
    assert drafts.text(tokens[-1].call) == result.answer
    # The answer's text comes before the step that records it.
    answer_at = next(o for o, e in events if isinstance(e, StepEvent) and e.step.kind == "answer")
    assert max(o for o, e in events if isinstance(e, TokensEvent)) < answer_at


async def test_streaming_changes_nothing_the_turn_decides(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        quiet = await (
            await start_turn(harness.client, TurnInput(question=QUESTION), task_queue)
        ).result()
        loud = await (
            await start_turn(harness.client, TurnInput(question=QUESTION, stream=True), task_queue)
        ).result()
    assert loud.answer == quiet.answer
    assert [(s.kind, s.text) for s in loud.steps] == [(s.kind, s.text) for s in quiet.steps]
    assert loud.usage.model_calls == quiet.usage.model_calls


class StutteringModel(ScriptedModel):
    """Writes half an answer, fails, and writes the whole of it when retried."""

    def __init__(self) -> None:
        super().__init__(plans=[Reply(text="unused")])
        self.attempts = 0

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        self.attempts += 1
        answer = "Your order 123456 has shipped."
        if self.attempts == 1:
            await write_out(answer[:14], stream, per_word_s=0.06)
            await asyncio.sleep(0.3)  # the batch is out before the failure
            raise ModelUnavailable("connection reset")
        await write_out(answer, stream, per_word_s=0.06)
        return Reply(text=answer)


async def test_a_retried_model_call_shows_no_doubled_text(harness: Harness) -> None:
    async with harness.worker(StutteringModel()) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted", stream=True)
        handle = await start_turn(harness.client, turn, task_queue)
        events = await read_turn(harness, handle.id)
        result = await handle.result()

    tokens = [e for _, e in events if isinstance(e, TokensEvent)]
    assert {t.attempt for t in tokens} == {1, 2}
    drafts = Drafts()
    changes = [drafts.add(t) for t in tokens]
    assert changes.count("restarted") == 1
    assert drafts.text(tokens[0].call) == result.answer == "Your order 123456 has shipped."


async def test_a_conversation_streams_its_turns_across_runs(harness: Harness) -> None:
    async with harness.worker() as task_queue:
        chat = ConversationInput(max_turns_per_run=1)
        conversation, first = await start_chat(harness.client, chat, QUESTION, task_queue)
        seen: list[tuple[int, object]] = []

        async def read() -> None:
            async for offset, event in chat_events(harness.client, conversation.id):
                seen.append((offset, event))
                if isinstance(event, TurnAnswered) and len(seen) == 4:
                    return

        reader = asyncio.create_task(read())
        await (await start_turn_result(harness, first.turn_id))
        await wait_for_new_run(conversation)
        second = await send(conversation, "When will it arrive?")
        await asyncio.wait_for(reader, timeout=30)
        await conversation.signal("end")
        tail = [e async for e in chat_events(harness.client, conversation.id, from_offset=3)]

    assert [o for o, _ in seen] == [0, 1, 2, 3]
    started = [e for _, e in seen if isinstance(e, TurnStarted)]
    assert [s.turn_id for s in started] == [first.turn_id, second.turn_id]
    answered = [e for _, e in seen if isinstance(e, TurnAnswered)]
    assert all(a.outcome is Outcome.ANSWERED for a in answered)
    assert [o for o, _ in tail] == [3, 4]
    assert isinstance(tail[-1][1], ChatEnded) and tail[-1][1].reason == "customer"


async def start_turn_result(harness: Harness, turn_id: str):  # type: ignore[no-untyped-def]
    return harness.client.get_workflow_handle(turn_id).result()


class QueryCounter(Interceptor):
    """Counts the queries a client sends."""

    def __init__(self) -> None:
        self.queries = 0

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        counter = self

        class Counting(OutboundInterceptor):
            async def query_workflow(self, input: QueryWorkflowInput) -> Any:
                counter.queries += 1
                return await super().query_workflow(input)

        return Counting(next)


async def test_readers_of_one_stream_share_one_poller(harness: Harness) -> None:
    """Twenty readers of a turn waiting for consent, from anywhere in its stream:
    each reads what one reader reads, and the worker answers the queries of one."""
    counter = QueryCounter()
    client = Client(**{**harness.client.config(), "interceptors": [counter]})
    scripted = ScriptedModel(plans=[Reply(calls=[RETURN])], decisions=[lambda _: Reply(text="ok")])
    async with harness.worker(scripted) as task_queue:
        turn = TurnInput(question="Return order 123456.", model="scripted", stream=True)
        handle = await start_turn(client, turn, task_queue)
        await until(handle, awaiting)
        before = counter.queries
        readers = [asyncio.create_task(read_turn_with(client, handle.id, n % 3)) for n in range(20)]
        await asyncio.sleep(3)  # all of them caught up, polling a turn that waits
        polled = counter.queries - before
        await decide(client, handle.id, None, approved=True, by="test")
        read = await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
        await handle.result()
        alone = await read_turn(harness, handle.id)

    assert all(r == alone[n % 3 :] for n, r in enumerate(read))
    assert isinstance(alone[-1][1], DoneEvent)
    assert polled <= 12, f"{polled} queries in 3 s: the readers poll one by one"


async def read_turn_with(client: Client, turn_id: str, offset: int) -> list[tuple[int, TurnEvent]]:
    return [e async for e in turn_events(client, turn_id, offset)]
