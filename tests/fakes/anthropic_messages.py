"""A Messages API server as strict as Anthropic's, which the real `anthropic` SDK talks to.

    server = MessagesServer()                     # scripted: server.replies = [...]
    server = MessagesServer(brain=offline_brain)
    ANTHROPIC_BASE_URL=<server.url> ANTHROPIC_API_KEY=test-key   # what a worker reads
    python -m tests.fakes.anthropic_messages --port 8001         # by hand, with the brain

It refuses, with a 400 `invalid_request_error` and the API's own wording where the API's
is known (`violation`):
- the first message not from the user; roles that do not alternate (stricter than the
  API, which merges them: a backend that relies on the merge is one that lost track);
- a `tool_use` not answered by a `tool_result` in the very next message, a
  `tool_result` for no `tool_use` of the message before it (or two for one), and text
  before the results in their message;
- with thinking on, a request that continues a round of tool use whose first assistant
  message does not open with its thinking; a thinking block whose signature is not the
  one this server gave its text (changed, or never given); a forced `tool_choice` with
  thinking; a budget under 1,024 or not under `max_tokens`;
- more than 4 `cache_control` breakpoints; a `ttl: 1h` breakpoint after a `5m` one, in
  the order the API reads a request: `tools`, `system`, `messages`; a `system` that is
  not text blocks; empty or blank text blocks;
- tools without a valid name, an object schema, or a name of their own;
- a parameter the API does not have; a temperature or top_p outside 0 to 1; stop
  sequences of whitespace; an effort it does not know; with thinking on, a
  temperature other than 1, a top_p under 0.95, any top_k (`_parameters`, `_thinking`).
A wrong `x-api-key` gets 401, a missing `anthropic-version` 400 and an unknown model 404.

Prompt caching as the API does it: a breakpoint writes the prefix up to it (tools,
system, messages, in that order; thinking settings are part of the messages' key) once
it is `min_cache_tokens` long, and a later request reads the longest prefix written
that ends at one of its breakpoints or up to 20 blocks before one. Usage reports
`cache_read_input_tokens`, `cache_creation_input_tokens` and the rest as
`input_tokens`, at about four characters a token.

It answers in the wire format: a whole `message`, or (`stream: true`) server-sent
events `message_start`, `content_block_start` / `_delta` / `_stop` for each block (text
deltas, `input_json_delta` pieces of a tool's input, `thinking_delta` then
`signature_delta`), a `ping`, `message_delta` with the stop reason and usage, and
`message_stop`. With thinking on, the model thinks at the start of a round (a request
that ends with the customer's words), not between tool calls, as without interleaved
thinking. Scripted errors: any status with `retry-after` (429, 529 ...), a refusal, a
reply cut short at `max_tokens`, and a stream that fails midway (`Cut`: an `error`
event, or a dropped connection).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from durable_agent.model import Reply
from durable_agent.tools import ToolSpec
from durable_agent.types import ToolCall
from tests.fakes.brain import Brain
from tests.fakes.chat_completions import _send_json, pieces

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
MAX_BREAKPOINTS = 4
LOOKBACK = 20
"""Blocks before a breakpoint at which the API looks for a prefix it has cached."""
STATUS_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"

Scripted = tuple[int, dict[str, str], dict[str, Any]]
"""status, headers, body: one HTTP answer (an error)."""


@dataclass
class Said:
    """What the model says in a reply: thinking (only where the request thinks and a
    round begins), text, tool calls (id, name, input), and why it stopped."""

    text: str = ""
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    thinking: str | None = None
    """Its thinking; None: a line of its own, when it thinks at all."""
    redacted: bool = False
    """A `redacted_thinking` block after the thinking, as the API sends some."""
    stop: str = ""
    """`end_turn`, `tool_use` (the default with calls), `max_tokens`, `refusal`..."""
    refusal_category: str | None = None


@dataclass
class Cut:
    """A reply that fails while the model writes it: streamed, `partial` text then an
    `error` event of `kind` (None: the connection drops); whole, `status` with the
    same error (or a dropped connection)."""

    partial: str = ""
    kind: str | None = "overloaded_error"
    status: int = 529


def text(words: str, stop: str = "end_turn") -> Said:
    return Said(text=words, stop=stop)


def tool_use(*calls: tuple[str, str, dict[str, Any]], words: str = "", **more: Any) -> Said:
    return Said(text=words, calls=list(calls), **more)


def refusal(partial: str = "", category: str | None = "cyber") -> Said:
    return Said(text=partial, stop="refusal", refusal_category=category)


def error(status: int, headers: dict[str, str] | None = None, message: str = "") -> Scripted:
    kind = STATUS_KINDS.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message or f"error {status}"}}
    return status, headers or {}, body


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


# --- the API's rules ------------------------------------------------------------------


class Signer:
    """Signs thinking as the API does: a signature holds for exactly that text, from
    this server."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def sign(self, text: str) -> str:
        digest = hmac.new(self._key, text.encode(), hashlib.sha256).digest()
        return base64.b64encode(digest).decode()

    def redacted(self) -> str:
        payload = secrets.token_hex(16)
        return f"{payload}.{self.sign('redacted:' + payload)}"

    def valid(self, block: dict[str, Any]) -> bool:
        if block.get("type") == "redacted_thinking":
            payload, _, signature = str(block.get("data", "")).partition(".")
            return hmac.compare_digest(signature, self.sign("redacted:" + payload))
        given = block.get("signature")
        thought = block.get("thinking")
        if not isinstance(given, str) or not isinstance(thought, str):
            return False
        return hmac.compare_digest(given, self.sign(thought))


def violation(body: dict[str, Any], signer: Signer | None = None) -> str | None:
    """What the API refuses in this request (400), or None. `signer`: the server whose
    thinking signatures are checked (None: thinking blocks are not checked)."""
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Input should be a valid integer greater than or equal to 1"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    return (
        _parameters(body)
        or _system(body)
        or _tools(body)
        or _thinking(body)
        or _messages(body, signer)
        or _cache(body)
    )


PARAMETERS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "stream",
        "metadata",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "output_config",
        "service_tier",
        "cache_control",
        "container",
        "inference_geo",
    }
)
"""The Messages API's parameters: anything else is refused."""
EFFORTS = ("low", "medium", "high", "xhigh", "max")


def _parameters(body: dict[str, Any]) -> str | None:
    """An unknown parameter; sampling out of its range (temperature and top_p from 0 to
    1); stop sequences that are not a list of text with something besides whitespace;
    an effort the API does not have."""
    for name in body:
        if name not in PARAMETERS:
            return f"{name}: Extra inputs are not permitted"
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name}: Input should be a valid number"
        if not 0 <= value <= 1:
            bound = "less than or equal to 1" if value > 1 else "greater than or equal to 0"
            return f"{name}: Input should be {bound}"
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        return "top_k: Input should be a valid integer greater than or equal to 0"
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
            return "stop_sequences: Input should be a valid list of strings"
        if any(not x.strip() for x in stops):
            return "stop_sequences: each stop sequence must contain non-whitespace"
    config = body.get("output_config")
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"effort", "format"}:
            return "output_config: Input should be an object of effort and format"
        if "effort" in config and config["effort"] not in EFFORTS:
            shown = ", ".join(f"'{e}'" for e in EFFORTS)
            return f"output_config.effort: Input should be {shown}"
    return None


def _system(body: dict[str, Any]) -> str | None:
    system = body.get("system")
    if system is None or isinstance(system, str):
        return None if system is None or system.strip() else "system: text must be non-empty"
    if not isinstance(system, list):
        return "system: Input should be a valid string or list of text blocks"
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            return f"system.{i}.type: Input should be 'text'"
        if not str(block.get("text", "")).strip():
            return "system: text content blocks must be non-empty"
    return None


def _tools(body: dict[str, Any]) -> str | None:
    tools = body.get("tools") or []
    names: list[str] = []
    for i, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return f"tools.{i}.custom.input_schema.type: Input should be 'object'"
        names.append(name)
    if len(set(names)) != len(names):
        return "tools: Tool names must be unique."
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none"):
            return "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"
        if kind == "tool" and choice.get("name") not in names:
            return f"tool_choice.name: no tool named {choice.get('name')!r} in `tools`"
        if not isinstance(choice.get("disable_parallel_tool_use", False), bool):
            return f"tool_choice.{kind}.disable_parallel_tool_use: Input should be a valid boolean"
    return None


def thinks(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _thinking(body: dict[str, Any]) -> str | None:
    thinking = body.get("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        return "thinking.type: Input should be 'enabled', 'adaptive' or 'disabled'"
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1_024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if budget >= body["max_tokens"]:
            return (
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult "
                f"our documentation at {THINKING_DOCS}#max-tokens-and-context-window-size"
            )
    choice = body.get("tool_choice")
    if thinks(body) and isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        return "Thinking may not be enabled when tool_choice forces tool use."
    if thinks(body) and body.get("temperature", 1) != 1:
        return (
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our "
            f"documentation at {THINKING_DOCS}#feature-compatibility"
        )
    if thinks(body) and body.get("top_p", 1) < 0.95:
        return (
            "`top_p` must be greater than or equal to 0.95 or unset when thinking is enabled. "
            f"Please consult our documentation at {THINKING_DOCS}#feature-compatibility"
        )
    if thinks(body) and "top_k" in body:
        return (
            "`top_k` must be unset when thinking is enabled. Please consult our documentation "
            f"at {THINKING_DOCS}#feature-compatibility"
        )
    return None


USER_BLOCKS = ("text", "tool_result", "image", "document")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")


def _messages(body: dict[str, Any], signer: Signer | None) -> str | None:
    messages: list[Any] = body["messages"]
    uses: list[str] = []  # the tool_use ids of the message before this one
    seen: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if i == 0 and role != "user":
            return 'messages: first message must use the "user" role'
        if i > 0 and messages[i - 1]["role"] == role:
            return (
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row'
            )
        blocks = _blocks(m.get("content"))
        if blocks is None:
            return f"messages.{i}.content: Input should be a non-empty string or list of blocks"
        allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
        for j, b in enumerate(blocks):
            if b.get("type") not in allowed:
                return f"messages.{i}.content.{j}.type: {b.get('type')!r} is not allowed for {role}"
            if b["type"] == "text" and not isinstance(b.get("text"), str):
                return f"messages.{i}.content.{j}.text: Field required"
            if b["type"] == "text" and not b["text"]:
                return "messages: text content blocks must be non-empty"
            if b["type"] == "text" and not b["text"].strip():
                return "messages: text content blocks must contain non-whitespace text"
            if b["type"] in ("image", "document") and (problem := _media(b, f"{i}.content.{j}")):
                return problem
            if b["type"] in ("thinking", "redacted_thinking"):
                if "cache_control" in b:
                    return f"messages.{i}.content.{j}: thinking blocks cannot be cached"
                if signer is not None and not signer.valid(b):
                    field_ = "signature" if b["type"] == "thinking" else "data"
                    return f"messages.{i}.content.{j}: Invalid `{field_}` in `{b['type']}` block"
        if role == "user":
            if problem := _results(i, blocks, uses):
                return problem
            uses = []
            continue
        uses = []
        for j, b in enumerate(blocks):
            if b["type"] != "tool_use":
                continue
            if not isinstance(b.get("id"), str) or not b["id"] or b["id"] in seen:
                return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
            if not isinstance(b.get("input"), dict):
                return f"messages.{i}.content.{j}.input: Input should be a valid dictionary"
            seen.add(b["id"])
            uses.append(b["id"])
        if uses and i + 1 == len(messages):
            return _unanswered(i, uses)
        if uses:
            answered = [
                b.get("tool_use_id")
                for b in _blocks(messages[i + 1].get("content")) or []
                if b.get("type") == "tool_result"
            ]
            if missing := [u for u in uses if u not in answered]:
                return _unanswered(i, missing)
    if thinks(body):
        return _opens_with_thinking(messages)
    return None


_MEDIA_MAGIC = {
    "image/png": b"\x89PNG",
    "image/jpeg": b"\xff\xd8\xff",
    "image/gif": b"GIF8",
    "image/webp": b"RIFF",
    "application/pdf": b"%PDF-",
}


def _media(block: dict[str, Any], where: str) -> str | None:
    """An `image` block: a base64 source of PNG, JPEG, GIF or WebP bytes of that type (or
    a URL). A `document` block: a base64 PDF, plain text (`media_type: text/plain`), or a
    URL; `title` a string if given."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "url":
        return (
            None
            if isinstance(source.get("url"), str)
            else f"messages.{where}.source.url: Field required"
        )
    image = block["type"] == "image"
    if block["type"] == "document" and kind == "text":
        if source.get("media_type") != "text/plain" or not isinstance(source.get("data"), str):
            return f"messages.{where}.source: a text source is text/plain data"
    elif kind == "base64":
        media = source.get("media_type")
        allowed = [t for t in _MEDIA_MAGIC if t.startswith("image/") == image]
        if media not in allowed:
            expected = " or ".join(map(repr, allowed))
            return f"messages.{where}.source.media_type: Input should be {expected}"
        try:
            data = base64.b64decode(source.get("data", ""), validate=True)
        except (binascii.Error, TypeError):
            return f"messages.{where}.source.data: not valid base64"
        if not data.startswith(_MEDIA_MAGIC[media]):
            return (
                f"messages.{where}: the {'image' if image else 'document'} is not a valid {media}"
            )
    else:
        return f"messages.{where}.source.type: Input tag {kind!r} does not match the expected tags"
    if "title" in block and not isinstance(block["title"], str):
        return f"messages.{where}.title: Input should be a valid string"
    return None


def _blocks(content: Any) -> list[dict[str, Any]] | None:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else None
    if not isinstance(content, list) or not content:
        return None
    if not all(isinstance(b, dict) for b in content):
        return None
    return content


def _unanswered(i: int, ids: list[str]) -> str:
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
        "`tool_result` block in the next message."
    )


def _results(i: int, blocks: list[dict[str, Any]], uses: list[str]) -> str | None:
    answered: set[str] = set()
    other = False
    for j, b in enumerate(blocks):
        if b["type"] != "tool_result":
            other = True
            continue
        if other:
            return (
                f"messages.{i}.content.{j}: `tool_result` blocks must come first in the "
                "content of their message, before any other block"
            )
        given = b.get("tool_use_id")
        if given not in uses:
            return (
                f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                f"blocks: {given}. Each `tool_result` block must have a corresponding "
                "`tool_use` block in the previous message."
            )
        if given in answered:
            return f"messages.{i}.content.{j}: more than one `tool_result` for {given}"
        answered.add(given)
        content = b.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return f"messages.{i}.content.{j}.content: Input should be a string or a list"
        if not isinstance(b.get("is_error", False), bool):
            return f"messages.{i}.content.{j}.is_error: Input should be a valid boolean"
    return None


def _human(message: dict[str, Any]) -> bool:
    """A user message with the customer's words (not only tool results)."""
    return message["role"] == "user" and any(
        b["type"] != "tool_result" for b in _blocks(message["content"]) or []
    )


def _opens_with_thinking(messages: list[dict[str, Any]]) -> str | None:
    """With thinking on, a request that continues a round of tool use (ends with tool
    results) needs the round's first assistant message to open with its thinking."""
    if _human(messages[-1]) or messages[-1]["role"] != "user":
        return None
    start = max(i for i, m in enumerate(messages) if _human(m)) + 1
    first = next(i for i in range(start, len(messages)) if messages[i]["role"] == "assistant")
    found = (_blocks(messages[first]["content"]) or [{}])[0].get("type")
    if found in ("thinking", "redacted_thinking"):
        return None
    return (
        f"messages.{first}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
        f"found `{found}`. When `thinking` is enabled, a final `assistant` message must start "
        "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` "
        "blocks). We recommend you include thinking blocks from previous turns. To avoid this "
        f"requirement, disable `thinking`. Please consult our documentation at {THINKING_DOCS}"
    )


def _cache(body: dict[str, Any]) -> str | None:
    marks = [(where, b["cache_control"]) for where, b in _in_order(body) if "cache_control" in b]
    if isinstance(body.get("cache_control"), dict):
        marks.append(("cache_control", body["cache_control"]))
    if len(marks) > MAX_BREAKPOINTS:
        return (
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {len(marks)}."
        )
    five_minutes = False
    for where, mark in marks:
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
            return f"{where}.cache_control.type: Input should be 'ephemeral'"
        ttl = mark.get("ttl", "5m")
        if ttl not in ("5m", "1h"):
            return f"{where}.cache_control.ttl: Input should be '5m' or '1h'"
        if ttl == "1h" and five_minutes:
            return (
                "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control "
                "block. Note that blocks are processed in the following order: `tools`, "
                "`system`, `messages`."
            )
        five_minutes |= ttl == "5m"
    return None


def _in_order(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every block of a request, as the API reads them: tools, system, messages."""
    blocks = [(f"tools.{i}", t) for i, t in enumerate(body.get("tools") or [])]
    system = body.get("system")
    if isinstance(system, list):
        blocks += [(f"system.{i}", b) for i, b in enumerate(system)]
    elif system:
        blocks.append(("system", {"type": "text", "text": system}))
    for i, m in enumerate(body["messages"]):
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        blocks += [(f"messages.{i}.content.{j}", b) for j, b in enumerate(parts)]
    return blocks


# --- the prompt cache -----------------------------------------------------------------


@dataclass
class Cached:
    read: int
    written: int
    total: int


class PromptCache:
    """Prefixes written at breakpoints, by the hash of everything up to them."""

    def __init__(self, min_tokens: int) -> None:
        self.min_tokens = min_tokens
        self._written: set[str] = set()

    def use(self, body: dict[str, Any]) -> Cached:
        blocks = _in_order(body)
        keys: list[str] = []
        sizes: list[int] = []
        digest = hashlib.sha256()
        size = 0
        # Thinking settings are part of the messages' key: changing them misses there.
        thinking = json.dumps(body.get("thinking"), sort_keys=True)
        for where, block in blocks:
            seen = {k: v for k, v in block.items() if k != "cache_control"}
            if where.startswith("messages.0.content.0"):
                digest.update(thinking.encode())
            part = where.split(".content.")[0] + json.dumps(seen, sort_keys=True)
            digest.update(part.encode())
            size += len(part)
            keys.append(digest.copy().hexdigest())
            sizes.append(size // 4)
        marks = [i for i, (_, b) in enumerate(blocks) if "cache_control" in b]
        read = 0
        for mark in marks:
            for at in range(mark, max(mark - LOOKBACK, -1), -1):
                if keys[at] in self._written:
                    read = max(read, sizes[at])
                    break
        writable = [m for m in marks if sizes[m] >= self.min_tokens]
        for mark in writable:
            self._written.add(keys[mark])
        written = max(0, sizes[writable[-1]] - read) if writable else 0
        return Cached(read=read, written=written, total=sizes[-1] if sizes else 0)


# --- the server -----------------------------------------------------------------------


@dataclass
class Received:
    at: float
    """time.monotonic() on arrival"""
    body: dict[str, Any]
    status: int
    """what the server answered"""
    usage: dict[str, int] = field(default_factory=dict)


class MessagesServer:
    def __init__(
        self,
        brain: Brain | None = None,
        api_key: str = "test-key",
        models: tuple[str, ...] = ("claude-sonnet-4-6",),
        port: int = 0,
        event_delay: float = 0.0,
        min_cache_tokens: int = 1_024,
    ) -> None:
        self.brain = brain
        self.api_key = api_key
        self.models = models
        self.event_delay = event_delay
        """Seconds between streamed events: a model takes its time to write."""
        self.replies: list[Said | Scripted | Cut] = []
        """Scripted answers, used in order before the brain (if any)."""
        self.requests: list[Received] = []
        self.signer = Signer()
        self.cache = PromptCache(min_cache_tokens)
        self._ids = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = server.answer(self.path, dict(self.headers), body)
                server.write(self, body, reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        """The base URL the SDK takes (`ANTHROPIC_BASE_URL`): it adds `/v1/messages`."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def accepted(self) -> list[dict[str, Any]]:
        """Bodies of the requests answered with 200: the model calls that happened."""
        return [r.body for r in self.requests if r.status == 200]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def model(self, name: str = "claude-sonnet-4-6", **options: Any) -> Any:
        from anthropic import AsyncAnthropic

        from durable_agent.backends.anthropic import AnthropicModel

        client = AsyncAnthropic(base_url=self.url, api_key=self.api_key, max_retries=0)
        return AnthropicModel(name, client=client, **options)

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
        with self._lock:
            usage: dict[str, int] = {}
            try:
                reply = self._answer(path, headers, body)
                if isinstance(reply, dict):
                    usage = reply["usage"]
            except Refused as e:
                reply = error(e.status, message=e.message)
            status = reply.status if isinstance(reply, Cut) else 200
            if isinstance(reply, tuple):
                status = reply[0]
            self.requests.append(Received(time.monotonic(), body, status, usage))
            return reply

    def _answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
        lowered = {k.lower(): v for k, v in headers.items()}
        if path.rstrip("/") != "/v1/messages":
            raise Refused(404, f"Not Found: POST {path}")
        if lowered.get("x-api-key") != self.api_key:
            raise Refused(401, "invalid x-api-key")
        if not lowered.get("anthropic-version"):
            raise Refused(400, "anthropic-version: header is required")
        if body.get("model") not in self.models:
            raise Refused(404, f"model: {body.get('model')}")
        if problem := violation(body, self.signer):
            raise Refused(400, problem)
        if self.replies:
            reply = self.replies.pop(0)
            if not isinstance(reply, Said):
                return reply  # an error, or a cut reply
        elif self.brain is not None:
            reply = self._from_brain(body)
        else:
            raise Refused(500, "the test scripted no reply for this request")
        return self._message(body, reply)

    def _message(self, body: dict[str, Any], said: Said) -> dict[str, Any]:
        """The whole message the model writes for this request."""
        content: list[dict[str, Any]] = []
        last = body["messages"][-1]
        if thinks(body) and _human(last):
            thought = said.thinking or f"The customer asks: {_words(last)[:60]}"
            content.append(
                {"type": "thinking", "thinking": thought, "signature": self.signer.sign(thought)}
            )
            if said.redacted:
                content.append({"type": "redacted_thinking", "data": self.signer.redacted()})
        if said.text:
            content.append({"type": "text", "text": said.text})
        for call_id, name, arguments in said.calls:
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
        stop = said.stop or ("tool_use" if said.calls else "end_turn")
        cached = self.cache.use(body)
        output = max(1, len(json.dumps(content)) // 4)
        details = None
        if said.refusal_category is not None:
            details = {"type": "refusal", "category": said.refusal_category, "explanation": None}
        return {
            "id": f"msg_{secrets.token_hex(12)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "stop_details": details,
            "usage": {
                "input_tokens": cached.total - cached.read - cached.written,
                "cache_creation_input_tokens": cached.written,
                "cache_read_input_tokens": cached.read,
                "output_tokens": output,
            },
        }

    def _from_brain(self, body: dict[str, Any]) -> Said:
        assert self.brain is not None
        reply: Reply = self.brain(*conversation(body))
        calls = []
        for c in reply.calls:
            self._ids += 1
            calls.append((f"toolu_{self._ids:024x}", c.name, c.arguments))
        return Said(text=reply.text, calls=calls)

    def write(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], reply: Any) -> None:
        """Send `reply` as the request asked for it: whole, or as a stream of events."""
        streaming = body.get("stream") is True
        if isinstance(reply, Cut) and streaming:
            start = self._message(body, Said(text=reply.partial))
            start["content"] = [c for c in start["content"] if c["type"] == "text"]
            events = stream_events(start)[:-3]  # the text so far; no stop, delta or end
            end = None
            if reply.kind is not None:
                end = ("error", {"type": "error", "error": {"type": reply.kind, "message": "!"}})
            _send_events(handler, events, self.event_delay, end)
        elif isinstance(reply, Cut):
            if reply.kind is None:
                handler.close_connection = True  # no answer at all: the connection drops
            else:
                _send_json(handler, *error(reply.status, message="Overloaded"))
        elif isinstance(reply, dict) and streaming:
            _send_events(handler, stream_events(reply), self.event_delay, None)
        elif isinstance(reply, dict):
            _send_json(handler, 200, {"request-id": "req_fake"}, reply)
        else:
            _send_json(handler, *reply)  # errors are whole JSON answers, streaming or not


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A whole message as the events the API streams it in."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_details": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        events += _block_events(index, block)
        if index == 0:
            events.append(("ping", {"type": "ping"}))
    delta = {
        "stop_reason": message["stop_reason"],
        "stop_sequence": None,
        "stop_details": message["stop_details"],
    }
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind = block["type"]
    if kind == "text":
        head: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    elif kind == "tool_use":
        head = {**block, "input": {}}
        arguments = json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": ""}]
        deltas += [
            {"type": "input_json_delta", "partial_json": arguments[at : at + 8]}
            for at in range(0, len(arguments), 8)
        ]
    elif kind == "thinking":
        head = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:  # redacted_thinking: whole in its start
        head, deltas = block, []
    start = {"type": "content_block_start", "index": index, "content_block": head}
    return [
        ("content_block_start", start),
        *(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def _send_events(
    handler: BaseHTTPRequestHandler,
    events: list[tuple[str, dict[str, Any]]],
    delay: float,
    end: tuple[str, dict[str, Any]] | None,
) -> None:
    """Server-sent events (`event:` and `data:` lines) in a chunked HTTP/1.1 body, then
    `end` (an `error` event) if any. A `Cut` with no error kind drops the connection
    without ending the body."""
    handler.protocol_version = "HTTP/1.1"
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.send_header("Connection", "close")
    handler.end_headers()

    def send(name: str, data: dict[str, Any]) -> None:
        frame = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        handler.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
        handler.wfile.flush()

    for name, data in events:
        send(name, data)
        time.sleep(delay)
    if end is not None:
        send(*end)
    elif events[-1][0] != "message_stop":
        return  # a cut reply with no error: the connection drops mid-body
    handler.wfile.write(b"0\r\n\r\n")


def _words(message: dict[str, Any]) -> str:
    return " ".join(b["text"] for b in _blocks(message["content"]) or [] if b["type"] == "text")


def conversation(body: dict[str, Any]) -> tuple[list[Message], list[ToolSpec]]:
    """A (valid) request as the canonical conversation and tool specs, for a brain."""
    messages: list[Message] = []
    names: dict[str, str] = {}
    for m in body["messages"]:
        blocks = _blocks(m["content"]) or []
        if m["role"] == "assistant":
            calls = []
            for b in blocks:
                if b["type"] == "tool_use":
                    names[b["id"]] = b["name"]
                    calls.append(ToolCall(id=b["id"], name=b["name"], arguments=b["input"]))
            said = "".join(b["text"] for b in blocks if b["type"] == "text")
            messages.append(AssistantMessage(text=said, calls=calls))
            continue
        for b in blocks:
            if b["type"] == "tool_result":
                content = b.get("content", "")
                if isinstance(content, list):
                    content = "".join(c.get("text", "") for c in content)
                ok = not b.get("is_error", False)
                call = b["tool_use_id"]
                messages.append(ToolResult(call_id=call, tool=names[call], ok=ok, text=content))
            elif b["type"] == "text":
                messages.append(UserMessage(text=b["text"]))
    tools = [
        ToolSpec(name=t["name"], description=t.get("description", ""), parameters=t["input_schema"])
        for t in body.get("tools") or []
    ]
    return messages, tools


def main() -> None:
    from tests.fakes.brain import offline_brain

    p = argparse.ArgumentParser(description="A strict Messages API server (offline brain).")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--model", default="claude-sonnet-4-6")
    p.add_argument("--api-key", default="test-key")
    args = p.parse_args()
    server = MessagesServer(
        brain=offline_brain, api_key=args.api_key, models=(args.model,), port=args.port
    )
    print(f"serving {args.model!r} on {server.url} (key {args.api_key!r}); Ctrl-C to stop")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.close()


if __name__ == "__main__":
    main()
