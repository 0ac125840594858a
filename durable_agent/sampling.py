"""MCP sampling as a durable step: a server's request for the agent's model.

    request = request_of("crm", params, "ask")   # a `sampling/createMessage` request
    reply = Reply.served(request, "The summary", model="gpt-x")

During a tool call, a server may ask the client's model for a message
(`sampling/createMessage`). The MCP client answers it from the replies the turn
recorded for that call (`REPLIES`, matched by `Request.digest`: the same server,
messages, system prompt and limits); with none, the call ends with the request
(`NeedsSampling`), and the turn decides: it asks a person's consent once per server
(the server's `sampling` setting: `ask`, the default; `allow`; `deny`), then asks its
own model, as a recorded model call of its own (counted in its usage and caps, its
input and output shields run on it), and runs the call again: the server's same
request now gets the recorded reply, or the one line saying why it was refused.
Everything here is plain Python the workflow, the activity and the MCP client share.

What a server cannot ask: more than `MAX_MESSAGES` messages or `MAX_CHARS` of text,
images or audio, tools (`UnusableSampling`, one line the server gets as its error);
it gets at most `MAX_TOKENS` tokens back, and never more than the turn has left.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel

from durable_agent.errors import ToolError

__all__ = [
    "MAX_CHARS",
    "MAX_MESSAGES",
    "MAX_REPLY_CHARS",
    "MAX_TOKENS",
    "REPLIES",
    "NeedsSampling",
    "Policy",
    "Reply",
    "Request",
    "SampledMessage",
    "UnusableSampling",
    "consent_message",
    "request_of",
]

MAX_MESSAGES = 20
"""Messages one request may carry: a short exchange, not a conversation to replay."""
MAX_CHARS = 32_000
"""Text one request may carry, its system prompt included (about 8k tokens)."""
MAX_TOKENS = 4096
"""The most one request's reply may be, whatever the server asks (its `maxTokens` is
capped by this and by what the turn's token cap leaves)."""
MAX_REPLY_CHARS = 4 * MAX_TOKENS * 4
"""What a reply may carry back (a backend that ignores the token limit included):
`MAX_TOKENS` at a generous 16 characters a token, cut past it."""
MAX_SAMPLES_PER_CALL = 5
"""Requests one tool call may make in turn (each served, the call runs again): a
server that asks forever ends the call instead."""

Policy = Literal["ask", "allow", "deny"]


class UnusableSampling(ToolError):
    """A sampling request the agent's model does not serve (images, tools, too large):
    the server gets the message as its request's error."""


class SampledMessage(BaseModel):
    role: Literal["user", "assistant"]
    text: str


class Request(BaseModel):
    """A server's `sampling/createMessage` during a tool call, as the turn records it."""

    server: str
    policy: Policy = "ask"
    """The server's `sampling` setting (the workflow cannot read the MCP config)."""
    messages: list[SampledMessage]
    system_prompt: str = ""
    max_tokens: int
    """What the server asked for, within `MAX_TOKENS`."""
    temperature: float | None = None
    stop_sequences: list[str] = []
    digest: str
    """What a reply is matched by: the same server and the same request."""

    @property
    def text(self) -> str:
        """The request as a shield reads it: the system prompt, then the messages."""
        said = [f"{m.role}: {m.text}" for m in self.messages]
        return "\n".join([f"system: {self.system_prompt}", *said] if self.system_prompt else said)


class Reply(BaseModel):
    """What the server's request gets: the model's text, or why it was refused."""

    digest: str
    text: str = ""
    model: str = ""
    stop_reason: str = ""
    refused: str = ""
    """Set: the server gets this line as its request's error, and no text."""

    @classmethod
    def served(cls, request: Request, text: str, *, model: str, stop_reason: str) -> Reply:
        return cls(digest=request.digest, text=text, model=model, stop_reason=stop_reason)

    @classmethod
    def refusal(cls, request: Request, why: str) -> Reply:
        return cls(digest=request.digest, refused=f"sampling refused: {why}")


class NeedsSampling(Exception):
    """A tool call whose server asked for the model, with no recorded reply yet."""

    def __init__(self, request: Request) -> None:
        super().__init__(f"{request.server} asks for the model")
        self.request = request


REPLIES: contextvars.ContextVar[dict[str, Reply] | None] = contextvars.ContextVar(
    "sampling_replies", default=None
)
"""The running tool call's recorded replies, by digest (the dispatch activity sets
them; the MCP client's sampling callback reads them)."""


def request_of(server: str, params: Any, policy: Policy = "ask") -> Request:
    """A `CreateMessageRequestParams` as a Request; `UnusableSampling` (one line) when
    the agent's model does not serve it."""
    where = f"MCP server {server!r} asked for the model"
    if getattr(params, "tools", None):
        raise UnusableSampling(f"{where} with tools: this client samples text only")
    raw = list(getattr(params, "messages", None) or [])
    if not raw or len(raw) > MAX_MESSAGES:
        raise UnusableSampling(f"{where} with {len(raw)} messages: 1 to {MAX_MESSAGES}")
    messages = []
    for m in raw:
        parts = m.content if isinstance(m.content, list) else [m.content]
        if any(getattr(p, "type", "") != "text" for p in parts):
            raise UnusableSampling(f"{where} with a message that is not text: text only")
        messages.append(SampledMessage(role=m.role, text="".join(p.text for p in parts)))
    system = str(getattr(params, "system_prompt", None) or "")
    if len(system) + sum(len(m.text) for m in messages) > MAX_CHARS:
        raise UnusableSampling(f"{where} with over {MAX_CHARS} characters of text")
    asked = getattr(params, "max_tokens", None)
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise UnusableSampling(f"{where} with no maxTokens (a whole number, at least 1)")
    temperature = getattr(params, "temperature", None)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        temperature = None
    elif not 0 <= temperature <= 1:  # what every backend takes
        temperature = min(max(float(temperature), 0.0), 1.0)
    stops = [str(s)[:100] for s in (getattr(params, "stop_sequences", None) or [])][:4]
    fields = {
        "messages": [m.model_dump() for m in messages],
        "system_prompt": system,
        "max_tokens": min(asked, MAX_TOKENS),
        "temperature": temperature,
        "stop_sequences": stops,
    }
    raw_json = json.dumps([server, fields], sort_keys=True, ensure_ascii=False)
    return Request(
        server=server,
        policy=policy,
        digest=hashlib.sha256(raw_json.encode()).hexdigest()[:32],
        **fields,  # type: ignore[arg-type]
    )


def consent_message(request: Request) -> str:
    """What a person is asked, once per server per turn (the question's form has no
    fields: accept allows, decline or cancel refuses)."""
    return (
        f"MCP server {request.server!r} asks to use the agent's model ({len(request.messages)} "
        f"message(s), up to {request.max_tokens} tokens) during this turn. Allow it?"
    )
