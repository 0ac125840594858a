"""MCP elicitation as a durable step: a server's question to the person a turn serves.

    question = question_of("crm", params)      # an `elicitation/create` request
    answer = Answer.of(question, "accept", {"email": "a@b.example"}, by="alice")

During a tool call, a server may ask for input (`elicitation/create`, form or URL
mode). The MCP client answers it from the answers the turn recorded for that call
(`ANSWERS`, matched by `Question.digest`: the same server, message and schema or
URL); with none, the call ends with the question (`NeedsAnswer`), the turn waits
for a person (durably: it is workflow state), and then runs the call again with the
answer, which the server now gets. Everything here is plain Python the workflow,
the activity and the clients share.

What a server cannot do with a question: a message is at most `MAX_MESSAGE_CHARS`,
a schema at most `MAX_SCHEMA_BYTES` and what MCP's form mode allows (a flat object
of string, number, integer, boolean and enum properties, checked with
`durable_agent.schemas`), a URL http(s) and at most `MAX_URL_CHARS`; past any, the
call fails with one line the model reads (`UnusableQuestion`). An answer is checked
against the schema before it is recorded (`InvalidAnswer`).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from durable_agent import schemas
from durable_agent.errors import InvalidAnswer, UnusableQuestion

__all__ = [
    "ANSWERS",
    "Action",
    "Answer",
    "AnswerInput",
    "InvalidAnswer",
    "NeedsAnswer",
    "Question",
    "UnusableQuestion",
    "check_answer",
    "filled",
    "question_of",
]

MAX_MESSAGE_CHARS = 2000
"""A server's message to the person: a paragraph, not a document."""
MAX_SCHEMA_BYTES = 8 * 1024
"""A form's schema: a few fields, each with a title and a description."""
MAX_PROPERTIES = 20
MAX_URL_CHARS = 2048
MAX_ANSWER_BYTES = 8 * 1024
"""A person's answer: what a form of `MAX_PROPERTIES` short fields holds."""
MAX_QUESTIONS_PER_CALL = 5
"""Questions one tool call may ask in turn (each answered, the call runs again): a
server that asks forever ends the call instead."""

Action = Literal["accept", "decline", "cancel"]
_PRIMITIVE = {"string", "number", "integer", "boolean"}
_PROPERTY_KEYS = {
    "type",
    "title",
    "description",
    "default",
    "enum",
    "enumNames",
    "oneOf",
    "anyOf",
    "items",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
}


class Question(BaseModel):
    """A server's `elicitation/create` during a tool call, as the turn records it."""

    id: str = ""
    """Unique in the turn, set by the turn: `<call id>.q<n>`."""
    call_id: str = ""
    tool: str = ""
    server: str
    mode: Literal["form", "url"] = "form"
    message: str
    requested_schema: dict[str, Any] | None = None
    """Form mode: what the answer's content must be (a flat object)."""
    url: str = ""
    """URL mode: where the person goes (the server hears of the result out of band)."""
    domain: str = ""
    """URL mode: the URL's host, which a person should check before opening it."""
    digest: str
    """What an answer is matched by: the same server, mode, message and schema or URL."""
    timeout_s: float | None = None
    """How long the turn waits for an answer (None: the agent's approval timeout);
    past it the server gets `cancel`."""
    since: datetime | None = None
    """When the turn started waiting (workflow time)."""


class Answer(BaseModel):
    """A person's answer to a question, as the turn records it and the server gets it."""

    digest: str
    action: Action
    content: dict[str, Any] | None = None
    by: str = ""

    @classmethod
    def of(cls, question: Question, action: str, content: Any = None, *, by: str = "") -> Answer:
        """The answer, its form's defaults filled in (`filled`), checked against the
        question (`InvalidAnswer`, one line)."""
        content = filled(question, action, content)
        check_answer(question, action, content)
        return cls(digest=question.digest, action=action, content=content, by=by)  # type: ignore[arg-type]


class AnswerInput(BaseModel):
    """Input of the turn's `answer` update."""

    question_id: str
    action: Action
    content: dict[str, Any] | None = None
    by: str = Field(min_length=1, max_length=100)
    """Who answered, for the record."""

    @field_validator("by")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return " ".join(v.split())


class NeedsAnswer(Exception):
    """A tool call that asked a question the turn has no answer to yet."""

    def __init__(self, question: Question) -> None:
        super().__init__(f"{question.server} asks: {question.message}")
        self.question = question


ANSWERS: contextvars.ContextVar[dict[str, Answer] | None] = contextvars.ContextVar(
    "elicitation_answers", default=None
)
"""The running tool call's recorded answers, by digest (the dispatch activity sets
them; the MCP client's elicitation callback reads them)."""


def question_of(server: str, params: Any, timeout_s: float | None = None) -> Question:
    """An `ElicitRequestParams` (form or URL mode) as a Question; `UnusableQuestion`
    when no person could be shown it."""
    mode = getattr(params, "mode", None) or "form"
    message = str(getattr(params, "message", "") or "")
    where = f"MCP server {server!r} asked for input"
    if len(message) > MAX_MESSAGE_CHARS:
        raise UnusableQuestion(
            f"{where} with a message over {MAX_MESSAGE_CHARS} characters: not shown"
        )
    if mode == "url":
        url = str(getattr(params, "url", "") or "")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL_CHARS:
            raise UnusableQuestion(f"{where} at a URL that is not http(s) or is too long")
        return Question(
            server=server,
            mode="url",
            message=message,
            url=url,
            domain=parts.hostname,
            digest=_digest(server, "url", message, url),
            timeout_s=timeout_s,
        )
    schema: Any = getattr(params, "requested_schema", None)
    if hasattr(schema, "model_dump"):
        schema = schema.model_dump(mode="json", by_alias=True, exclude_none=True)
    _check_form(where, schema)
    return Question(
        server=server,
        message=message,
        requested_schema=schema,
        digest=_digest(server, "form", message, schema),
        timeout_s=timeout_s,
    )


def _check_form(where: str, schema: Any) -> None:
    """A form MCP allows: an object of primitive properties, small, and a schema this
    project can check a value against within its budget."""
    try:
        size = len(json.dumps(schema, sort_keys=True, allow_nan=False).encode())
    except (TypeError, ValueError):
        raise UnusableQuestion(f"{where} with a schema that is not JSON") from None
    if size > MAX_SCHEMA_BYTES:
        raise UnusableQuestion(f"{where} with a schema over {MAX_SCHEMA_BYTES // 1024} KB")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise UnusableQuestion(f"{where} with a schema that is not an object of fields")
    if not isinstance(properties, dict) or len(properties) > MAX_PROPERTIES:
        raise UnusableQuestion(f"{where}: a form has 0 to {MAX_PROPERTIES} properties")
    for name, prop in properties.items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        flat = kind in _PRIMITIVE or (kind == "array" and "items" in prop)
        if not flat or set(prop) - _PROPERTY_KEYS:
            raise UnusableQuestion(
                f"{where}: field {name[:50]!r} is not a string, number, integer, boolean or "
                "enum (MCP forms are flat)"
            )
    try:
        schemas.validator(schema)
    except schemas.UnusableSchema as e:
        raise UnusableQuestion(f"{where} with a schema that cannot be checked: {e}") from None


def filled(question: Question, action: str, content: Any) -> Any:
    """An accepted form's content with the schema's `default` of each field it leaves
    out (MCP's SEP-1034: the client applies them, so a person may accept a form as it
    was shown); anything else as it is. The result is checked like any answer."""
    properties = (question.requested_schema or {}).get("properties")
    if action != "accept" or question.mode != "form" or not isinstance(properties, dict):
        return content
    if content is not None and not isinstance(content, dict):
        return content  # refused by `check_answer`, in its words
    given = content or {}
    missing = {
        name: prop["default"]
        for name, prop in properties.items()
        if isinstance(prop, dict) and "default" in prop and name not in given
    }
    return {**given, **missing} if missing else content


def check_answer(question: Question, action: str, content: Any, *, form: bool = True) -> None:
    """`InvalidAnswer`, in one line, unless `action` with `content` answers `question`:
    accept in form mode with content the schema takes; accept in URL mode, decline and
    cancel with none. `form=False`: all but the check against the schema (the workflow's
    own check: `jsonschema` cannot be imported in its sandbox)."""
    if action not in ("accept", "decline", "cancel"):
        raise InvalidAnswer(f"action: accept, decline or cancel, not {str(action)[:20]!r}")
    if action != "accept" or question.mode == "url":
        if content is not None:
            raise InvalidAnswer(f"{action} carries no content (only accept of a form does)")
        return
    if content is None and not (question.requested_schema or {}).get("properties"):
        return  # a form of no fields: a yes or no (a server's request to sample)
    if not isinstance(content, dict):
        raise InvalidAnswer("accept of a form carries content: a JSON object of its fields")
    try:
        size = len(json.dumps(content, allow_nan=False).encode())
    except (TypeError, ValueError):
        raise InvalidAnswer("the answer's content is not JSON") from None
    if size > MAX_ANSWER_BYTES:
        raise InvalidAnswer(f"the answer is over {MAX_ANSWER_BYTES // 1024} KB")
    if not form:
        return
    errors = list(schemas.validator(question.requested_schema or {}).iter_errors(content))
    if errors:
        first = errors[0]
        at = "/".join(str(p) for p in first.absolute_path) or "the answer"
        raise InvalidAnswer(
            f"the answer does not fit the form {question.server!r} asked for: {at}: "
            f"{' '.join(str(first.message).split())[:200]}"
        )


def _digest(server: str, mode: str, message: str, what: Any) -> str:
    raw = json.dumps([server, mode, message, what], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]
