"""Streaming from the providers: the OpenAI-compatible backend with `stream: true`
and the Bedrock backend with `converse_stream`, against fakes that stream as the
real APIs do (`tests/fakes/chat_completions.py`, `tests/fakes/converse.py`).

Streaming must never change what a turn decides: for the same response, the
streamed reply equals the whole one (text, calls with their ids and arguments,
usage), a failure mid-stream is classified as the same failure of a whole
request, and the text reaches the sink in pieces that join to the reply."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import (
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)

from durable_agent.backends.bedrock import BedrockConverseModel
from durable_agent.backends.openai_chat import OpenAIChatModel, classify
from durable_agent.errors import (
    ModelCannotAnswer,
    ModelError,
    ModelRequestRejected,
    ModelUnavailable,
)
from durable_agent.model import Reply
from durable_agent.runtime.streams import turn_events
from durable_agent.runtime.turns import start_turn
from durable_agent.stream import Drafts, TextSink, TokensEvent
from durable_agent.types import Outcome, TurnInput
from tests.conftest import Harness, request
from tests.fakes import chat_completions as chat
from tests.fakes import converse

QUESTION = "Has order 123456 shipped? And my return rtn001?"
ANSWER = "Your order 123456 has shipped: 2 × Herbal Handsoap."
LONG = " ".join(f"Step {i}: the parcel with order 123456 moves on." for i in range(60))
PARTIAL = "Your order 123456 has"

Answer = Reply | ModelError
"""What a model call comes to: a reply, or the error the backend raised."""
Ask = Callable[[Any, bool], Awaitable[tuple[Answer, list[str]]]]
"""Sends one request answered by a scripted reply; streams it when told to."""


async def via_openai(scripted: Any, stream: bool, **options: Any) -> tuple[Answer, list[str]]:
    """One request to a fresh server (a fresh prompt cache: usage is comparable)."""
    server = chat.ChatCompletionsServer(**options)
    server.replies = [scripted]
    pieces: list[str] = []
    try:
        return await server.model().plan(request(QUESTION), _sink(pieces, stream)), pieces
    except ModelError as e:
        return e, pieces
    finally:
        server.close()


async def via_bedrock(scripted: Any, stream: bool) -> tuple[Answer, list[str]]:
    fake = converse.ConverseFake([scripted])
    model = BedrockConverseModel("anthropic.claude-3-5-haiku-20241022-v1:0", client=fake)
    pieces: list[str] = []
    try:
        return await model.plan(request(QUESTION), _sink(pieces, stream)), pieces
    except ModelError as e:
        return e, pieces


def _sink(pieces: list[str], stream: bool) -> TextSink | None:
    return pieces.append if stream else None


ORDER = ("order_status", {"order_id": "123456"})
RETURN = ("return_status", {"return_id": "rtn001"})


def openai_calls(*calls: tuple[str, dict[str, Any]]) -> chat.Scripted:
    return chat.tool_calls(*((f"call_{n}", c[0], json.dumps(c[1])) for n, c in enumerate(calls)))


ANSWERS: dict[str, tuple[Ask, Any]] = {
    "openai text": (via_openai, chat.text(ANSWER)),
    "openai two calls": (via_openai, openai_calls(ORDER, RETURN)),
    "openai long": (via_openai, chat.text(LONG)),
    "openai cut short": (via_openai, chat.text(LONG, finish="length")),
    "bedrock text": (via_bedrock, converse.said(ANSWER)),
    "bedrock two calls": (via_bedrock, converse.tool_use(ORDER, RETURN, text="Let me look.")),
    "bedrock long": (via_bedrock, converse.said(LONG)),
    "bedrock cut short": (via_bedrock, converse.said(LONG, stop="max_tokens")),
}


def same(streamed: Reply, whole: Reply) -> None:
    assert streamed.model_dump() == whole.model_dump()  # text, calls, usage
    assert streamed.finish_reason == whole.finish_reason
    assert streamed.response_model == whole.response_model


@pytest.mark.parametrize("case", ANSWERS)
async def test_a_streamed_reply_is_the_whole_reply(case: str) -> None:
    ask, scripted = ANSWERS[case]
    whole, _ = await ask(scripted, False)
    streamed, pieces = await ask(scripted, True)

    assert isinstance(whole, Reply) and isinstance(streamed, Reply)
    same(streamed, whole)
    assert streamed.usage.input_tokens > 0 and streamed.usage.output_tokens > 0
    written = "".join(pieces)
    if streamed.calls:
        assert [c.id for c in streamed.calls] == [c.id for c in whole.calls]
        assert [c.arguments for c in streamed.calls] == [ORDER[1], RETURN[1]]
        assert written == streamed.text  # what the model said alongside, if anything
    elif streamed.finish_reason in ("length", "max_tokens"):
        assert streamed.text == written.rstrip() + " …"
    else:
        assert written == streamed.text
    if written:
        assert len(pieces) > 1, "the text comes in pieces as the model writes it"
    if case.endswith("long"):
        assert len(pieces) > 100


async def test_a_server_that_streams_no_usage_leaves_it_at_zero() -> None:
    whole, _ = await via_openai(chat.text(ANSWER), False)
    streamed, pieces = await via_openai(chat.text(ANSWER), True, stream_usage=False)

    assert isinstance(whole, Reply) and isinstance(streamed, Reply)
    assert streamed.text == whole.text == "".join(pieces)
    assert streamed.usage.input_tokens == streamed.usage.output_tokens == 0
    assert whole.usage.input_tokens > 0


FAILURES: dict[str, tuple[Ask, Any, type[ModelError]]] = {
    "openai error event": (via_openai, chat.Cut(PARTIAL), ModelUnavailable),
    "openai dropped": (via_openai, chat.Cut(PARTIAL, message=None), ModelUnavailable),
    "bedrock throttled": (
        via_bedrock,
        converse.Broken(PARTIAL, "ThrottlingException", "Too many requests"),
        ModelUnavailable,
    ),
    "bedrock internal": (via_bedrock, converse.Broken(PARTIAL), ModelUnavailable),
    "bedrock dropped": (via_bedrock, converse.Broken(PARTIAL, code=None), ModelUnavailable),
    "bedrock invalid": (
        via_bedrock,
        converse.Broken(PARTIAL, "ValidationException", "Malformed input request"),
        ModelRequestRejected,
    ),
    "bedrock too long": (
        # This model's context window: another model of the turn may take it (fallback).
        via_bedrock,
        converse.Broken(PARTIAL, "ValidationException", "Input is too long"),
        ModelCannotAnswer,
    ),
}


@pytest.mark.parametrize("case", FAILURES)
async def test_a_failure_mid_stream_is_the_failure_of_a_whole_request(case: str) -> None:
    ask, scripted, expected = FAILURES[case]
    whole, _ = await ask(scripted, False)
    streamed, pieces = await ask(scripted, True)

    assert type(whole) is type(streamed) is expected
    assert "".join(pieces) == PARTIAL, "what was written before the failure reached the sink"
    if case.startswith("bedrock") and "dropped" not in case:
        assert str(streamed) == str(whole)  # the same code and the service's own words
    elif "error" in case:
        assert chat.SERVER_ERROR in str(streamed) and chat.SERVER_ERROR in str(whole)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_before_the_stream_is_classified_as_ever(stream: bool) -> None:
    refused, _ = await via_openai(chat.error(401, message="Incorrect API key provided."), stream)
    busy, _ = await via_openai(chat.error(429, {"retry-after": "2"}), stream)
    throttled, _ = await via_bedrock(
        converse.refuse("Slow down", "ThrottlingException", 429), stream
    )

    assert isinstance(refused, ModelRequestRejected) and "OPENAI_API_KEY" in str(refused)
    assert isinstance(busy, ModelUnavailable) and busy.retry_after == 2
    assert isinstance(throttled, ModelUnavailable)


def test_an_error_event_with_a_status_is_classified_by_it() -> None:
    """vLLM names the status it means in the error event's `code`.

    Built as the SDK's stream reader builds it: with the request the stream answered.
    """
    request = httpx.Request("POST", "http://127.0.0.1:8000/v1/chat/completions")
    body = {"message": "prompt too long", "type": "BadRequestError", "code": 400}
    e = openai.APIError("prompt too long", request=request, body=body)
    assert isinstance(classify(e), ModelRequestRejected)
    body = {"message": "overloaded", "type": "ServiceUnavailableError", "code": 503}
    e = openai.APIError("overloaded", request=request, body=body)
    assert isinstance(classify(e), ModelUnavailable)


# --- Bedrock reads in a thread; the sink lives on the event loop ----------------------


async def test_bedrock_writes_on_the_event_loop_and_leaves_it_free() -> None:
    fake = converse.ConverseFake([converse.said(LONG)], event_delay=0.002)
    model = BedrockConverseModel("anthropic.claude-3-5-haiku-20241022-v1:0", client=fake)
    threads: set[int] = set()
    pieces: list[str] = []

    def sink(text: str) -> None:
        threads.add(threading.get_ident())
        pieces.append(text)

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    reply = await model.plan(request(QUESTION), sink)
    ticker.cancel()

    assert threads == {threading.get_ident()}, "the sink is called on the loop's thread"
    assert "".join(pieces) == reply.text == LONG  # every piece is in before the reply
    assert ticks >= 10, "the loop ran while the stream was read"


async def test_bedrock_stops_reading_when_the_call_is_cancelled() -> None:
    fake = converse.ConverseFake([converse.said(LONG)], event_delay=0.01)
    model = BedrockConverseModel("anthropic.claude-3-5-haiku-20241022-v1:0", client=fake)
    pieces: list[str] = []
    call = asyncio.create_task(model.plan(request(QUESTION), pieces.append))
    while len(pieces) < 3:
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    written, body = len(pieces), fake.bodies[0]
    await asyncio.sleep(0.2)
    assert len(pieces) == written, "no text after the call ended"
    assert body.closed, "the reader closed the stream"
    assert body.sent < len(chat.pieces(LONG)), "and stopped reading it early"


# --- the fakes stream as the APIs do --------------------------------------------------


def _raw(server: chat.ChatCompletionsServer, body: dict[str, Any]) -> tuple[int, str]:
    """A request as bytes on the wire, the answer's status and body as text."""
    connection = http.client.HTTPConnection("127.0.0.1", server.httpd.server_address[1])
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = connection.getresponse()
    return response.status, response.read().decode()


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_the_fake_streams_server_sent_events_as_openai_does() -> None:
    server = chat.ChatCompletionsServer()
    server.replies = [openai_calls(ORDER, RETURN), chat.text(ANSWER)]
    try:
        status, calls = _raw(server, _body(stream=True, stream_options={"include_usage": True}))
        _, text = _raw(server, _body(stream=True))
    finally:
        server.close()

    assert status == 200
    for raw in (calls, text):
        events = raw.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""]
        assert all(e.startswith("data: {") for e in events[:-2])
    chunks = [json.loads(e[len("data: ") :]) for e in calls.split("\n\n")[:-2]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    pieces = [tc for c in chunks for ch in c["choices"] for tc in ch["delta"].get("tool_calls", [])]
    heads = [p for p in pieces if "id" in p]
    assert [(h["index"], h["id"], h["function"]["name"]) for h in heads] == [
        (0, "call_0", "order_status"),
        (1, "call_1", "return_status"),
    ]
    for index, (_, arguments) in enumerate((ORDER, RETURN)):
        fragments = [p["function"]["arguments"] for p in pieces if p["index"] == index]
        assert len(fragments) > 2 and json.loads("".join(fragments)) == arguments
        assert all(set(p) == {"index", "function"} for p in pieces if p not in heads)
    # Usage only when asked: a last chunk with no choices; `null` on the others.
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert "usage" not in text


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ({"stream_options": {"include_usage": True}}, "only allowed when 'stream' is enabled"),
        ({"stream": "yes"}, "Invalid type for 'stream'"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "include_usage"),
    ],
)
def test_the_fake_refuses_bad_stream_options(extra: dict[str, Any], refusal: str) -> None:
    server = chat.ChatCompletionsServer()
    try:
        status, answer = _raw(server, _body(**extra))
    finally:
        server.close()
    assert status == 400 and refusal in json.loads(answer)["error"]["message"]


def test_the_fake_checks_a_streamed_conversation_as_strictly() -> None:
    server = chat.ChatCompletionsServer()
    bad = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
    try:
        status, answer = _raw(server, {"model": "test-model", "messages": bad, "stream": True})
    finally:
        server.close()
    assert status == 400 and "roles must alternate" in answer


def _ping() -> dict[str, Any]:
    return {"modelId": "m", "messages": [{"role": "user", "content": [{"text": "hi"}]}]}


def test_the_converse_fake_streams_the_service_events() -> None:
    fake = converse.ConverseFake([converse.tool_use(ORDER, RETURN, text="Let me look.")])
    tools = {
        "tools": [
            {"toolSpec": {"name": n, "inputSchema": {"json": {}}}} for n, _ in (ORDER, RETURN)
        ]
    }
    events = list(fake.converse_stream(**_ping(), toolConfig=tools)["stream"])

    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    starts = [e["contentBlockStart"] for e in events if "contentBlockStart" in e]
    assert [(s["contentBlockIndex"], s["start"]["toolUse"]["name"]) for s in starts] == [
        (1, "order_status"),
        (2, "return_status"),
    ]
    deltas = [e["contentBlockDelta"] for e in events if "contentBlockDelta" in e]
    text = "".join(d["delta"]["text"] for d in deltas if d["contentBlockIndex"] == 0)
    order = "".join(d["delta"]["toolUse"]["input"] for d in deltas if d["contentBlockIndex"] == 1)
    assert text == "Let me look." and json.loads(order) == ORDER[1]
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    assert events[-1]["metadata"]["usage"]["inputTokens"] > 0


def test_the_converse_fake_validates_a_stream_request() -> None:
    from botocore.exceptions import ClientError, ParamValidationError

    fake = converse.ConverseFake([converse.said("x")])
    with pytest.raises(ParamValidationError):
        fake.converse_stream(modelId="m", messages="hi")
    backwards = {"modelId": "m", "messages": [{"role": "assistant", "content": [{"text": "a"}]}]}
    with pytest.raises(ClientError, match="must start with a user message"):
        fake.converse_stream(**backwards)


# --- through a turn ---------------------------------------------------------------------


async def _streamed_turn(harness: Harness, model: Any) -> tuple[Any, list[TokensEvent]]:
    async with harness.worker(model) as task_queue:
        turn = TurnInput(question=QUESTION, model="scripted", stream=True)
        handle = await start_turn(harness.client, turn, task_queue)

        async def read() -> list[TokensEvent]:
            return [
                e
                async for _, e in turn_events(harness.client, handle.id)
                if isinstance(e, TokensEvent)
            ]

        tokens = await asyncio.wait_for(read(), timeout=30)
        return await handle.result(), tokens


async def test_a_turn_streams_the_providers_text(harness: Harness) -> None:
    server = chat.ChatCompletionsServer(chunk_delay=0.002)
    server.replies = [openai_calls(ORDER, RETURN), chat.text(LONG)]
    try:
        result, tokens = await _streamed_turn(harness, server.model())
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED and result.answer == LONG
    assert len(tokens) >= 2, "the answer is published in batches while it is written"
    assert "".join(t.text for t in tokens) == result.answer
    assert result.usage.model_calls == len(server.accepted) == 2
    assert all(r.body["stream"] is True for r in server.requests)


async def test_a_turn_streams_bedrock_text(harness: Harness) -> None:
    fake = converse.ConverseFake(
        [converse.tool_use(ORDER, RETURN), converse.said(LONG)], event_delay=0.002
    )
    model = BedrockConverseModel("anthropic.claude-3-5-haiku-20241022-v1:0", client=fake)
    result, tokens = await _streamed_turn(harness, model)

    assert result.outcome is Outcome.ANSWERED and result.answer == LONG
    assert len(tokens) >= 2
    assert "".join(t.text for t in tokens) == result.answer
    assert result.usage.model_calls == len(fake.accepted) == 2


async def test_a_stream_cut_mid_answer_is_retried_without_doubled_text(harness: Harness) -> None:
    server = chat.ChatCompletionsServer(chunk_delay=0.02)
    server.replies = [chat.Cut(PARTIAL), chat.text(ANSWER)]
    try:
        result, tokens = await _streamed_turn(harness, server.model())
    finally:
        server.close()

    assert result.outcome is Outcome.ANSWERED and result.answer == ANSWER
    assert {t.attempt for t in tokens} == {1, 2}
    drafts = Drafts()
    for t in tokens:
        drafts.add(t)
    assert drafts.text(tokens[0].call) == ANSWER
    assert result.usage.model_calls == len(server.accepted) == 1


async def test_streaming_changes_nothing_a_provider_turn_decides(harness: Harness) -> None:
    results = []
    for stream in (False, True):
        server = chat.ChatCompletionsServer()
        # One call: parallel calls record their steps in the order they finish.
        server.replies = [openai_calls(ORDER), chat.text(ANSWER)]
        try:
            async with harness.worker(server.model()) as task_queue:
                turn = TurnInput(question=QUESTION, model="scripted", stream=stream)
                handle = await start_turn(harness.client, turn, task_queue)
                results.append(await handle.result())
        finally:
            server.close()
    quiet, loud = results
    assert loud.answer == quiet.answer == ANSWER
    assert [(s.kind, s.text) for s in loud.steps] == [(s.kind, s.text) for s in quiet.steps]
    assert loud.usage.model_dump() == quiet.usage.model_dump()


# --- what real servers do that the fakes do not -----------------------------------------


class _Chunks:
    """A `create(stream=True)` result from a list of chunks (what the SDK yields)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = chunks

    async def __aenter__(self) -> _Chunks:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def __aiter__(self) -> Any:
        for chunk in self._chunks:
            yield chunk


def _openai_stub(chunks: list[ChatCompletionChunk]) -> Any:
    """An `AsyncOpenAI` stand-in whose streamed completion is `chunks`."""

    async def create(**_: Any) -> _Chunks:
        return _Chunks(chunks)

    return SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))


def _chunk(delta: ChoiceDelta, finish: str | None = None) -> ChatCompletionChunk:
    choice = Choice.construct(index=0, delta=delta, finish_reason=finish)
    return ChatCompletionChunk.construct(model="m", choices=[choice])


def _piece(id: str | None, name: str | None, arguments: str) -> ChatCompletionChunk:
    function = ChoiceDeltaToolCallFunction.construct(name=name, arguments=arguments)
    call = ChoiceDeltaToolCall.construct(index=None, id=id, function=function)
    return _chunk(ChoiceDelta.construct(content=None, tool_calls=[call]))


async def test_tool_call_pieces_without_an_index_are_put_together_by_id() -> None:
    """Some OpenAI-compatible servers leave `index` out of a call's pieces."""
    chunks = [
        _piece("call_a", "order_status", '{"order_id": '),
        _piece(None, None, '"123456"}'),
        _piece("call_b", "return_status", '{"return_id": "rtn001"}'),
        _chunk(ChoiceDelta.construct(content=None, tool_calls=None), "tool_calls"),
    ]
    model = OpenAIChatModel("m", client=_openai_stub(chunks))
    written: list[str] = []
    reply = await model.plan(request(QUESTION), written.append)
    assert [(c.id, c.name, c.arguments) for c in reply.calls] == [
        ("call_a", "order_status", ORDER[1]),
        ("call_b", "return_status", RETURN[1]),
    ]
    assert written == []


async def test_a_bedrock_stream_that_ends_before_its_message_is_retried() -> None:
    class Stub:
        def converse_stream(self, **_: Any) -> dict[str, Any]:
            start = {"messageStart": {"role": "assistant"}}
            delta = {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"text": "Your"}}}
            return {"stream": iter([start, delta])}

    model = BedrockConverseModel("anthropic.claude-3-5-haiku-20241022-v1:0", client=Stub())
    pieces: list[str] = []
    with pytest.raises(ModelUnavailable, match="ended before its message"):
        await model.plan(request(QUESTION), pieces.append)
    assert pieces == ["Your"]
