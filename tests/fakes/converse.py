"""A stand-in for a `bedrock-runtime` client's `converse`, as strict as the service.

    client = ConverseFake(replies=[tool_use(("order_status", {"order_id": "123456"})),
                                   said("It shipped.")])
    client = ConverseFake(brain=offline_brain)

Every request is first checked by botocore's own parameter validation against
the service model (what boto3 refuses before sending), then against the rules
Bedrock enforces on a conversation, refused as the service does: a
`ValidationException` (HTTP 400) in the service's words. The rules: the first
message is the user's; user and assistant alternate; no blank text block;
`toolUse` only from the assistant and `toolResult` only from the user; every
`toolUse` is answered by a `toolResult` with its id in the very next message,
and no `toolResult` answers anything else; tool blocks need a `toolConfig`; the
conversation ends with a user message; `inferenceConfig`'s temperature and topP are
at most 1. With cache points in the request, usage reports the cached prefix as the
service would.

`converse_stream` takes the same requests (checked against its own input shape)
and returns `{"stream": ...}` as boto3 does: botocore's own `EventStream` over
the binary event-stream messages the service sends, so events are parsed by the
service model and an exception event raises botocore's `EventStreamError`. The
events: `messageStart`; per content block, `contentBlockStart` (tool use only:
its id and name), `contentBlockDelta` pieces (text, or the tool's input as JSON
text) and `contentBlockStop`; `messageStop` with the stop reason; `metadata`
with usage. A `Broken` reply fails mid-answer: streamed, its partial text, then
an exception event (or a dropped connection); not streamed, the error a whole
response gets instead.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import time
from binascii import crc32
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import botocore.session
from botocore.eventstream import EventStream
from botocore.exceptions import ClientError, ConnectionClosedError
from botocore.parsers import EventStreamJSONParser
from botocore.validate import validate_parameters
from urllib3.exceptions import ProtocolError

from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from durable_agent.model import Reply
from durable_agent.tools import ToolSpec
from durable_agent.types import ToolCall
from tests.fakes.brain import Brain
from tests.fakes.chat_completions import pieces

_SERVICE = botocore.session.get_session().get_service_model("bedrock-runtime")
_CONVERSE = _SERVICE.operation_model("Converse")
_CONVERSE_STREAM = _SERVICE.operation_model("ConverseStream")


def refuse(
    message: str, code: str = "ValidationException", status: int = 400, operation: str = "Converse"
) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


@dataclass
class Broken:
    """A reply that fails while the model writes it.

    Streamed: its `partial` text, then an exception event `code` (or, with `code`
    None, the connection breaks). Not streamed: what a whole response gets instead,
    that error as a `ClientError` with its HTTP status (or a closed connection)."""

    partial: str = ""
    code: str | None = "InternalServerException"
    message: str = "The server encountered an error processing the request. Try again."


def violation(params: dict[str, Any]) -> str | None:
    """What Bedrock refuses in this (shape-valid) request, or None."""
    messages = params["messages"]
    if not messages or messages[0]["role"] != "user":
        return (
            "A conversation must start with a user message. Try again with a conversation "
            "that starts with a user message."
        )
    uses_tools = False
    pending: list[str] = []
    names: set[str] = set()
    for i, m in enumerate(messages):
        if i and m["role"] == messages[i - 1]["role"]:
            return (
                "A conversation must alternate between user and assistant roles. Make sure the "
                "conversation alternates between user and assistant roles and try again."
            )
        answered = []
        if problem := _media_violation(m, i, names):
            return problem
        for j, block in enumerate(m["content"]):
            where = f"messages.{i}.content.{j}"
            if "text" in block and not block["text"].strip():
                return (
                    f"The text field in the ContentBlock object at {where} is blank. "
                    "Add text to the text field, and try again."
                )
            if "toolUse" in block:
                uses_tools = True
                if m["role"] != "assistant":
                    return f"{where}: toolUse blocks are only allowed in assistant messages"
            if "toolResult" in block:
                uses_tools = True
                if m["role"] != "user":
                    return f"{where}: toolResult blocks are only allowed in user messages"
                tool_use_id = block["toolResult"]["toolUseId"]
                if tool_use_id not in pending:
                    return (
                        f"{where}.toolResult.toolUseId: unexpected tool_use_id found in "
                        f"tool_result blocks: {tool_use_id}. Each tool_result block must have a "
                        "corresponding tool_use block in the previous message."
                    )
                answered.append(tool_use_id)
        missing = [p for p in pending if p not in answered]
        if missing:
            return (
                f"Expected toolResult blocks at messages.{i}.content for the following Ids: "
                f"{', '.join(missing)}"
            )
        pending = [b["toolUse"]["toolUseId"] for b in m["content"] if "toolUse" in b]
    if pending:
        return f"Expected toolResult blocks for the following Ids: {', '.join(pending)}"
    if uses_tools and "toolConfig" not in params:
        return (
            "The toolConfig field must be defined when using toolUse and toolResult content blocks."
        )
    if messages[-1]["role"] != "user":
        return "A conversation must end with a user message. Try again with a user message."
    for j, block in enumerate(params.get("system", [])):
        if "text" in block and not block["text"].strip():
            return f"The text field in the SystemContentBlock at system.{j} is blank."
    config = params.get("inferenceConfig", {})
    for name in ("temperature", "topP"):
        # botocore checks the least value of the service model, the service the most.
        if config.get(name, 0) > 1:
            return f"The value at inferenceConfig.{name} must be less than or equal to 1."
    return None


_DOCUMENT_NAME = re.compile(r"^[A-Za-z0-9\-()\[\]]+( [A-Za-z0-9\-()\[\]]+)*$")
_IMAGE_MAGIC = {"png": b"\x89PNG", "jpeg": b"\xff\xd8\xff", "gif": b"GIF8", "webp": b"RIFF"}
MAX_IMAGE_BYTES = 3_750_000
MAX_DOCUMENT_BYTES = 4_500_000


def _media_violation(m: dict[str, Any], i: int, names: set[str]) -> str | None:
    """Bedrock's rules for `image` and `document` blocks (botocore has checked their
    shape): user messages only; bytes of the format they say, within the size the
    service takes; a document's name of letters, digits, hyphens, parentheses, square
    brackets and single spaces, unique in the request, and a text block beside it."""
    for j, block in enumerate(m["content"]):
        where = f"messages.{i}.content.{j}"
        if "image" in block:
            image = block["image"]
            data = image["source"].get("bytes", b"")
            if m["role"] != "user":
                return f"{where}: image blocks are only allowed in user messages"
            if not data.startswith(_IMAGE_MAGIC[image["format"]]) or len(data) > MAX_IMAGE_BYTES:
                return (
                    f"{where}.image: the provided image does not match its format, or is too large"
                )
        if "document" in block:
            document = block["document"]
            data = document["source"].get("bytes", b"")
            if m["role"] != "user":
                return f"{where}: document blocks are only allowed in user messages"
            if not _DOCUMENT_NAME.match(document["name"]) or document["name"] in names:
                return (
                    f"{where}.document.name: the document name can only contain alphanumeric "
                    "characters, whitespace characters (no more than one in a row), hyphens, "
                    "parentheses, and square brackets, and must be unique"
                )
            names.add(document["name"])
            if document["format"] == "pdf" and not data.startswith(b"%PDF-"):
                return f"{where}.document: the provided document is not a valid pdf"
            if len(data) > MAX_DOCUMENT_BYTES:
                return f"{where}.document: the document is larger than {MAX_DOCUMENT_BYTES} bytes"
            if not any("text" in b for b in m["content"]):
                return f"{where}: a document block needs a text block in the same message"
    return None


def conversation(params: dict[str, Any]) -> tuple[list[Message], list[ToolSpec]]:
    """A (valid) request as the canonical conversation and tool specs, for a brain."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    for m in params["messages"]:
        texts = [b["text"] for b in m["content"] if "text" in b]
        if m["role"] == "assistant":
            calls = []
            for b in m["content"]:
                if "toolUse" in b:
                    use = b["toolUse"]
                    names[use["toolUseId"]] = use["name"]
                    calls.append(
                        ToolCall(id=use["toolUseId"], name=use["name"], arguments=use["input"])
                    )
            messages.append(AssistantMessage(text="".join(texts), calls=calls))
            continue
        for b in m["content"]:
            if "toolResult" in b:
                r = b["toolResult"]
                messages.append(
                    ToolResult(
                        call_id=r["toolUseId"],
                        tool=names[r["toolUseId"]],
                        ok=r.get("status") != "error",
                        text="".join(c.get("text", "") for c in r["content"]),
                    )
                )
        if texts:
            messages.append(UserMessage(text="".join(texts)))
    tools = [
        ToolSpec(
            name=t["toolSpec"]["name"],
            description=t["toolSpec"].get("description", ""),
            parameters=t["toolSpec"]["inputSchema"]["json"],
        )
        for t in params.get("toolConfig", {}).get("tools", [])
        if "toolSpec" in t
    ]
    return messages, tools


def said(text: str, stop: str = "end_turn") -> dict[str, Any]:
    """A reply that says something."""
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop,
    }


def tool_use(*calls: tuple[str, dict[str, Any]], text: str = "") -> dict[str, Any]:
    """A reply asking for calls: (name, input). Ids are given by the fake."""
    content: list[dict[str, Any]] = [{"text": text}] if text else []
    content += [{"toolUse": {"toolUseId": "", "name": n, "input": i}} for n, i in calls]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": "tool_use",
    }


class ConverseFake:
    def __init__(
        self,
        replies: Iterable[dict[str, Any] | Exception | Broken] = (),
        brain: Brain | None = None,
        event_delay: float = 0.0,
    ) -> None:
        self.replies: list[dict[str, Any] | Exception | Broken] = list(replies)
        self.brain = brain
        self.event_delay = event_delay
        """Seconds between streamed events: a model takes its time to write."""
        self.requests: list[dict[str, Any]] = []
        """Every request that reached the service (passed botocore's validation)."""
        self.accepted: list[dict[str, Any]] = []
        """The requests answered with a reply: the model calls that happened."""
        self.bodies: list[_Body] = []
        """The streams' bodies, as `converse_stream` answered them: a test can see
        how much of each was sent and whether the reader closed it."""
        self._prefixes: list[str] = []
        self._ids = 0

    def converse(self, **params: Any) -> dict[str, Any]:
        reply = self._answer(params, _CONVERSE)
        if isinstance(reply, Broken):
            raise _whole_failure(reply)
        return reply

    def converse_stream(self, **params: Any) -> dict[str, Any]:
        reply = self._answer(params, _CONVERSE_STREAM)
        frames = _broken_frames(reply) if isinstance(reply, Broken) else _frames(reply)
        self.bodies.append(body := _Body(frames, self.event_delay))
        return {
            "ResponseMetadata": {"HTTPStatusCode": 200},
            "stream": EventStream(
                body,
                _CONVERSE_STREAM.output_shape.members["stream"],
                EventStreamJSONParser(),
                _CONVERSE_STREAM.name,
            ),
        }

    def _answer(self, params: dict[str, Any], operation: Any) -> dict[str, Any] | Broken:
        """The reply to a request, or the error the service answers it with."""
        validate_parameters(params, operation.input_shape)  # raises ParamValidationError
        self.requests.append(params)
        if problem := violation(params):
            raise refuse(problem, operation=operation.name)
        if self.replies:
            reply = self.replies.pop(0)
            if isinstance(reply, Exception):
                raise reply
            if isinstance(reply, Broken):
                return reply
            reply = json.loads(json.dumps(reply))
        elif self.brain is not None:
            reply = self._from_brain(self.brain(*conversation(params)))
        else:
            raise refuse(
                "the test scripted no reply for this request",
                "InternalServerException",
                500,
                operation.name,
            )
        for block in reply["output"]["message"]["content"]:
            if "toolUse" in block and not block["toolUse"]["toolUseId"]:
                self._ids += 1
                block["toolUse"]["toolUseId"] = f"tooluse_{self._ids:022d}"
        reply["usage"] = self._usage(params, reply)
        reply.setdefault("metrics", {"latencyMs": 100})
        self.accepted.append(params)
        return reply

    def _from_brain(self, reply: Reply) -> dict[str, Any]:
        if not reply.calls:
            return said(reply.text)
        return tool_use(*((c.name, c.arguments) for c in reply.calls), text=reply.text)

    def _usage(self, params: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        """Tokens at about four characters each; with cache points, the prefix up to the
        last cache point is written once and read by every later identical request."""
        # Bytes (an image's, a document's) count as their base64, as the service bills
        # them by size too.
        prompt = json.dumps(
            [params.get("system"), params.get("toolConfig"), params["messages"]],
            default=lambda b: base64.b64encode(b).decode(),
        )
        cacheable = 0
        if any("cachePoint" in b for b in params.get("system", [])):
            cacheable = len(json.dumps([params.get("system"), params.get("toolConfig")]))
        read = write = 0
        if cacheable:
            head = prompt[:cacheable]
            if head in self._prefixes:
                read = cacheable // 4
            else:
                write = cacheable // 4
                self._prefixes.append(head)
        total_in = len(prompt) // 4
        out = len(json.dumps(reply["output"])) // 4
        usage = {
            "inputTokens": total_in - read - write,
            "outputTokens": out,
            "totalTokens": total_in + out,
        }
        if cacheable:
            usage |= {"cacheReadInputTokens": read, "cacheWriteInputTokens": write}
        return usage


# --- the event stream, as the service sends it ----------------------------------------


def events(reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A whole reply as the events `converse_stream` sends it in: (type, payload)."""
    out: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
    for i, block in enumerate(reply["output"]["message"]["content"]):
        deltas: list[dict[str, Any]]
        if "text" in block:
            deltas = [{"text": piece} for piece in pieces(block["text"])]
        else:
            use = block["toolUse"]
            start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
            out.append(("contentBlockStart", {"contentBlockIndex": i, "start": start}))
            text = json.dumps(use["input"])
            deltas = [{"toolUse": {"input": text[at : at + 8]}} for at in range(0, len(text), 8)]
        out += [("contentBlockDelta", {"contentBlockIndex": i, "delta": d}) for d in deltas]
        out.append(("contentBlockStop", {"contentBlockIndex": i}))
    out.append(("messageStop", {"stopReason": reply["stopReason"]}))
    out.append(("metadata", {"usage": reply["usage"], "metrics": reply["metrics"]}))
    return out


def _frames(reply: dict[str, Any]) -> Iterator[bytes]:
    for kind, payload in events(reply):
        yield _event(kind, payload)


def _broken_frames(broken: Broken) -> Iterator[bytes]:
    yield _event("messageStart", {"role": "assistant"})
    for piece in pieces(broken.partial):
        yield _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece}})
    if broken.code is None:
        raise ProtocolError("Connection broken: IncompleteRead(0 bytes read)")
    # In the stream, an exception is named as the stream's member: `throttlingException`.
    kind = broken.code[:1].lower() + broken.code[1:]
    headers = {":message-type": "exception", ":exception-type": kind}
    yield _message(headers, {"message": broken.message})


def _whole_failure(broken: Broken) -> Exception:
    """What `converse` raises where the stream would have broken."""
    if broken.code is None:
        return ConnectionClosedError(endpoint_url="https://bedrock-runtime.us-east-1.amazonaws.com")
    status = _SERVICE.shape_for(broken.code).metadata["error"]["httpStatusCode"]
    return refuse(broken.message, broken.code, status)


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return _message({":message-type": "event", ":event-type": kind}, payload)


def _message(headers: dict[str, str], payload: dict[str, Any]) -> bytes:
    """One message of the binary event-stream encoding: a prelude (lengths and their
    CRC), string headers, a JSON payload, and the whole message's CRC."""
    head = b""
    for name, value in {**headers, ":content-type": "application/json"}.items():
        raw = value.encode()
        head += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(raw)) + raw
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(head) + len(body) + 4, len(head))
    prelude += struct.pack(">I", crc32(prelude) & 0xFFFFFFFF)
    message = prelude + head + body
    return message + struct.pack(">I", crc32(message) & 0xFFFFFFFF)


class _Body:
    """The HTTP body botocore's `EventStream` reads: the messages as they are sent."""

    def __init__(self, frames: Iterator[bytes], delay: float) -> None:
        self._frames = frames
        self._delay = delay
        self.sent = 0
        self.closed = False

    def stream(self) -> Iterator[bytes]:
        for frame in self._frames:
            if self.closed:
                return
            self.sent += 1
            yield frame
            time.sleep(self._delay)

    def close(self) -> None:
        self.closed = True
