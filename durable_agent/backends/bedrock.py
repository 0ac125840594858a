"""Amazon Bedrock through the Converse API, with native tool use.

    --model bedrock:<model-id>      e.g. bedrock:anthropic.claude-3-5-haiku-20241022-v1:0
    AGENT_BEDROCK_CACHE_POINT=1     prompt caching: a cache point after the system
                                    prompt and after the tools (models that support it)

Credentials and region come from the standard AWS settings the worker sees
(AWS_PROFILE, AWS_REGION, AWS_* keys, instance roles). Every request is the
canonical conversation (`agent.conversation`) as Converse messages: the system
prompt in `system`, the same on every call; then user and assistant messages
alternating, the model's `toolUse` blocks as it sent them, and each call's
`toolResult` (with its `toolUseId`) in the user message right after; the
conversation always ends with a user message. `plan` and `interpret` send the
same kind of request.

Given a `TextSink`, the request goes to `converse_stream`: text goes to the sink
as it comes, `toolUse` blocks are put together from their input's pieces, and
the reply is the one `converse` would have given. An error inside the event
stream is classified as the same error before it would be.

A typed turn offers the output tool (`ModelRequest.final_tool`) and sets `toolChoice`
so the model answers with a tool call: `any` (it may call other tools first), or that
tool when it is the only one.

Model settings (`ModelRequest.settings`): the output limit, temperature, top_p and stop
sequences in `inferenceConfig`; a model's own parameters (`extra`) in
`additionalModelRequestFields`. Converse has no seed, parallel-call switch or reasoning
effort: those are ignored, and said so (`unsupported_settings`).

botocore's own retries are off (one attempt per activity attempt): throttling,
timeouts, 5xx and a model that is not ready yet become `ModelUnavailable`; bad
credentials, access denied, validation errors and unknown models become
`ModelRequestRejected`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from durable_agent import attachments
from durable_agent.backends import _aws
from durable_agent.backends.prompts import INSTRUCTIONS
from durable_agent.compaction import known_window
from durable_agent.conversation import AssistantMessage, UserMessage
from durable_agent.errors import ModelCannotAnswer, ModelRequestRejected, ModelUnavailable
from durable_agent.model import ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.stream import TextSink
from durable_agent.types import ToolCall, Usage

CACHE_POINT = {"cachePoint": {"type": "default"}}
NOT_IN_CONVERSE_NAMES = ("seed", "parallel_tool_calls", "reasoning_effort")
NOT_IN_CONVERSE = "Converse has no such parameter; a model's own goes in extra"
GUARDRAIL_ANSWER = "Sorry, I can't help with that."


class BedrockConverseModel:
    provider = "aws.bedrock"

    def __init__(
        self,
        model_id: str,
        client: Any = None,
        instructions: str = INSTRUCTIONS,
        cache_point: bool | None = None,
    ) -> None:
        if not model_id:
            raise ModelRequestRejected(
                "name the model: --model bedrock:<model-id>, e.g. "
                "bedrock:anthropic.claude-3-5-haiku-20241022-v1:0"
            )
        self.name = model_id
        self.context_window = known_window(model_id)
        """Tokens, when the model is one `durable_agent.compaction` knows."""
        self._instructions = instructions
        if cache_point is None:
            cache_point = os.environ.get("AGENT_BEDROCK_CACHE_POINT", "").strip() in ("1", "true")
        self._cache_point = cache_point
        self._client = client or _aws.client("bedrock-runtime", "bedrock")

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        kwargs = self.request(request)
        try:
            if stream is None:
                # boto3 is synchronous: keep the worker's event loop free meanwhile.
                resp = await asyncio.to_thread(self._client.converse, **kwargs)
            else:
                resp = (await self._streamed(kwargs, stream)).response()
        except ModelUnavailable:
            raise  # a stream that ended too soon: already said
        except Exception as e:
            raise _aws.classify(e, "Bedrock", "model id") from e
        return _reply(resp)

    async def _streamed(self, kwargs: dict[str, Any], sink: TextSink) -> _Streamed:
        """`converse_stream`, read in a thread (boto3 blocks); each piece of text is
        handed to `sink` on the event loop, which is where the activity's sink lives."""
        loop = asyncio.get_running_loop()
        done = False  # set when the call ends: reading stops, and so does text for `sink`

        def deliver(text: str) -> None:
            if not done:
                sink(text)

        def read() -> _Streamed:
            streamed = _Streamed()
            events = self._client.converse_stream(**kwargs)["stream"]
            try:
                for event in events:
                    if done:
                        break  # the call was cancelled: stop reading
                    if text := streamed.add(event):
                        loop.call_soon_threadsafe(deliver, text)
            finally:
                if close := getattr(events, "close", None):
                    close()
            return streamed

        try:
            return await asyncio.to_thread(read)
        finally:
            done = True

    # A chat model answers "what next, given the results" from the same conversation.
    interpret = plan

    def unsupported_settings(self, request: ModelRequest) -> dict[str, str]:
        """Converse has no seed, parallel-call switch or reasoning effort of its own: a
        model's own parameter for them goes in `extra` (`additionalModelRequestFields`)."""
        settings = request.settings
        if settings is None:
            return {}
        return {name: NOT_IN_CONVERSE for name in settings.given() if name in NOT_IN_CONVERSE_NAMES}

    def request(self, request: ModelRequest) -> dict[str, Any]:
        """The `converse` keyword arguments for a request."""
        system: list[dict[str, Any]] = [{"text": request.instructions or self._instructions}]
        if self._cache_point:
            system.append(CACHE_POINT)
        kwargs: dict[str, Any] = {
            "modelId": self.name,
            "system": system,
            "messages": to_messages(request),
        }
        if request.tools:
            tools: list[dict[str, Any]] = [
                {
                    "toolSpec": {
                        "name": t.name,
                        "description": t.description,
                        "inputSchema": {"json": t.parameters},
                    }
                }
                for t in request.tools
            ]
            if self._cache_point:
                tools.append(CACHE_POINT)
            kwargs["toolConfig"] = {"tools": tools}
            if request.final_tool:
                # A typed turn ends with the output tool: the model must call a tool
                # (it may call others first), and that one when it is the only one.
                only = len(request.tools) == 1
                choice = {"tool": {"name": request.final_tool}} if only else {"any": {}}
                kwargs["toolConfig"]["toolChoice"] = choice
        if request.settings is not None:
            kwargs.update(_settings(request.settings))
        return kwargs


def _settings(settings: ModelSettings) -> dict[str, Any]:
    """The settings Converse takes (`inferenceConfig`), and a model's own parameters
    (`additionalModelRequestFields`, which Bedrock passes to the model as they are)."""
    config = {
        "maxTokens": settings.max_tokens,
        "temperature": settings.temperature,
        "topP": settings.top_p,
        "stopSequences": settings.stop or None,
    }
    sent: dict[str, Any] = {}
    if inference := {k: v for k, v in config.items() if v is not None}:
        sent["inferenceConfig"] = inference
    if settings.extra:
        sent["additionalModelRequestFields"] = dict(settings.extra)
    return sent


def _reply(resp: dict[str, Any]) -> Reply:
    stop = resp.get("stopReason", "")
    blocks = resp.get("output", {}).get("message", {}).get("content", [])
    text = "".join(b["text"] for b in blocks if "text" in b)
    calls = [_decode_call(b["toolUse"]) for b in blocks if "toolUse" in b]
    if stop == "guardrail_intervened":
        calls = []  # the guardrail's message is the answer; run nothing it blocked
        text = text.strip() or GUARDRAIL_ANSWER
    if not calls and not text.strip():
        if stop == "content_filtered":
            raise ModelCannotAnswer("the model's content filter withheld its reply")
        raise ModelUnavailable(f"the model returned an empty message (stopReason {stop!r})")
    if stop == "max_tokens" and not calls:
        text = text.rstrip() + " …"  # cut short: still the best answer there is
    u = resp.get("usage", {})
    cached = u.get("cacheReadInputTokens", 0) or 0
    usage = Usage(
        model_calls=1,
        # Converse counts cache reads and writes apart from `inputTokens`.
        input_tokens=u.get("inputTokens", 0) + cached + (u.get("cacheWriteInputTokens", 0) or 0),
        output_tokens=u.get("outputTokens", 0),
        cached_input_tokens=cached,
    )
    return Reply(text=text if calls else text.strip(), calls=calls, usage=usage, finish_reason=stop)


class _Streamed:
    """`converse_stream`'s events put back together as `converse` returns the
    message, so that one function makes the reply either way."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.stop: str | None = None
        self.usage: dict[str, Any] = {}

    def add(self, event: dict[str, Any]) -> str:
        """Take the next event; returns the text it adds ("" when none)."""
        if start := event.get("contentBlockStart"):
            use = start["start"].get("toolUse")
            if use is not None:
                use = {"toolUseId": use["toolUseId"], "name": use["name"], "input": ""}
                self.blocks[start["contentBlockIndex"]] = {"toolUse": use}
        elif delta := event.get("contentBlockDelta"):
            return self._add_delta(delta["contentBlockIndex"], delta["delta"])
        elif stop := event.get("messageStop"):
            self.stop = stop["stopReason"]
        elif metadata := event.get("metadata"):
            self.usage = metadata.get("usage", {})
        return ""

    def _add_delta(self, index: int, delta: dict[str, Any]) -> str:
        # Text blocks start with their first delta; a tool's input comes as JSON text.
        if "text" in delta:
            self.blocks.setdefault(index, {"text": ""})["text"] += delta["text"]
            return str(delta["text"])
        if "toolUse" in delta and "toolUse" in self.blocks.get(index, {}):
            self.blocks[index]["toolUse"]["input"] += delta["toolUse"]["input"]
        return ""  # reasoning and other blocks: not part of the reply, as with `converse`

    def response(self) -> dict[str, Any]:
        """What `converse` would have returned for the same message."""
        if self.stop is None:
            raise ModelUnavailable("the model's stream ended before its message did")
        content = [self.blocks[i] for i in sorted(self.blocks)]
        for block in content:
            if "toolUse" in block:
                block["toolUse"]["input"] = _json_input(block["toolUse"]["input"])
        return {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": self.stop,
            "usage": self.usage,
        }


def _json_input(text: str) -> Any:
    """A tool's input as streamed (JSON text; nothing for no input), or the text as
    it came when it is not JSON: `_decode_call` says it is not an object."""
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:
        return text


def _decode_call(use: dict[str, Any]) -> ToolCall:
    args = use.get("input")
    if isinstance(args, dict):
        return ToolCall(id=use["toolUseId"], name=use["name"], arguments=args)
    return ToolCall(id=use["toolUseId"], name=use["name"], error="not a JSON object")


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The conversation as Converse messages: a call's results ride in one user message."""
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for m in request.messages:
        if isinstance(m, UserMessage):
            add("user", [{"text": m.text}, *_attached(m, request)])
        elif isinstance(m, AssistantMessage):
            # Converse refuses blank text blocks; a message of calls alone has none.
            blocks: list[dict[str, Any]] = [{"text": m.text}] if m.text.strip() else []
            blocks += [
                {"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.arguments}}
                for c in m.calls
            ]
            add("assistant", blocks)
        else:
            add(
                "user",
                [
                    {
                        "toolResult": {
                            "toolUseId": m.call_id,
                            "content": [{"text": m.text}],
                            "status": "success" if m.ok else "error",
                        }
                    }
                ],
            )
    return messages


def _attached(m: UserMessage, request: ModelRequest) -> list[dict[str, Any]]:
    """A message's attachments as Converse blocks: an image as an `image` block, a PDF
    or a text file as a `document` block (its name as Converse allows one)."""
    blocks: list[dict[str, Any]] = []
    for i, a in enumerate(m.attachments, 1):
        data = request.attached(a)
        if attachments.kind(a) == "image":
            image = {"format": a.content_type.split("/")[1], "source": {"bytes": data}}
            blocks.append({"image": image})
        else:
            fmt = "pdf" if attachments.kind(a) == "document" else "txt"
            name = _document_name(a.name, i)
            blocks.append({"document": {"format": fmt, "name": name, "source": {"bytes": data}}})
    return blocks


def _document_name(name: str, n: int) -> str:
    """Converse takes a document name of letters, digits, single spaces, hyphens,
    parentheses and square brackets, unique in the request: the file's, so cleaned,
    and numbered."""
    stem = re.sub(r"[^A-Za-z0-9\-()\[\] ]", " ", name.rsplit(".", 1)[0])
    return f"{n} {' '.join(stem.split())}"[:200].strip()
