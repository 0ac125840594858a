"""Filling a tool's arguments from the customer's own words, by its JSON schema.

Text-completion models (and the offline model) often name a tool without
usable arguments; the schema tells what to look for instead, as the original
e-commerce agent's tool parser did:

- an id (a parameter with a `pattern`, like `order_id` ~ `\\d{6}`): the first
  match in the text that is not given as an example ("like 123456");
- a reason (a free-text parameter that asks *why*, like `start_return`'s
  `reason`): the customer's reason, the clauses of the message that are not
  the request itself ("I want to return order 123456, the soap is broken" ->
  "the soap is broken"); left out when there is none, so that nobody records
  the whole request as its own reason;
- a value its description shows by quoted examples of a structured shape
  (`timezone`: "IANA name, e.g. 'America/New_York'"): the first word of the text
  of the same shape ("Europe/Paris"), each value to one parameter, in order;
- any other free text (a search query): the whole question.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from durable_agent.schemas import safe_for_backtracking
from durable_agent.tools import ToolSpec


@dataclass(frozen=True)
class Param:
    name: str
    pattern: re.Pattern[str] | None
    """Unanchored pattern to find the value in a text; None for free text."""
    description: str
    tool_words: tuple[str, ...] = ()
    """The words of the tool's name (`start_return` -> start, return): a clause
    saying them is the request, not the reason for it."""
    shape: re.Pattern[str] | None = None
    """For free text its description shows by examples: the examples' shape."""
    kind: str | None = "string"
    """Its JSON type (`string`, `array`, ...); None when the schema says none. Words
    of a message fill only a string."""
    limits: tuple[int, int | None] = (0, None)
    """The string's `minLength` and `maxLength`."""
    choices: tuple[str, ...] = ()
    """Its `enum`: the values it may take (empty: any)."""
    exact: re.Pattern[str] | None = None
    """Its `pattern`, as the schema says it (case and all)."""

    def accepts(self, value: str) -> bool:
        """Whether `value` is valid for it, as its schema says: a call with a value it
        does not accept would only be refused."""
        low, high = self.limits
        return (
            self.kind in ("string", None)
            and low <= len(value) <= (high if high is not None else len(value))
            and (not self.choices or value in self.choices)
            and (self.exact is None or self.exact.search(value) is not None)
        )

    @property
    def is_id(self) -> bool:
        return self.pattern is not None

    @property
    def is_reason(self) -> bool:
        """Free text that asks why, which the customer says in a clause of its own;
        other free text (a query) is the question itself."""
        if self.is_id or self.shape is not None:
            return False
        description = self.description.lower()
        return self.name == "reason" or description.startswith("why") or "reason" in description


def id_noun(param: Param) -> str:
    """What an id names: "order ID (6 digits ...)" -> "order"."""
    m = re.match(r"\s*([a-z ]+?)\s+id\b", param.description, re.IGNORECASE)
    return (m.group(1) if m else param.name.removesuffix("_id").replace("_", " ")).lower()


def required_params(spec: ToolSpec) -> tuple[Param, ...]:
    props: dict[str, Any] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))
    tool_words = tuple(w for w in spec.name.lower().split("_") if w)
    params = []
    for name, schema in props.items():
        if name not in required:
            continue
        pattern = schema.get("pattern")
        compiled = exact = None
        # Searched with Python's `re` over what the customer wrote: only a pattern that
        # cannot backtrack for long (a tool's schema may come from an MCP server).
        if isinstance(pattern, str) and pattern and safe_for_backtracking(pattern):
            body = pattern.removeprefix("^").removesuffix("$")
            try:
                compiled = re.compile(rf"(?<![\w-])(?:{body})(?![\w-])", re.IGNORECASE)
                exact = re.compile(pattern)
            except re.error:  # a pattern Python does not read: no id to find by it
                compiled = exact = None
        description = str(schema.get("description", name))
        shape = None if compiled else shape_of_examples(description)
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        params.append(
            Param(
                name,
                compiled,
                description,
                tool_words,
                shape,
                kind=_json_type(schema),
                limits=(
                    low if isinstance(low, int) else 0,
                    high if isinstance(high, int) else None,
                ),
                choices=tuple(str(c) for c in schema.get("enum", ()) if isinstance(c, str)),
                exact=exact,
            )
        )
    return tuple(params)


def _json_type(schema: dict[str, Any]) -> str | None:
    """The JSON type a schema gives a value: its `type` (`string` when that is one of
    several), else the one type its `anyOf` branches agree on; None when it says none."""
    said = schema.get("type")
    if isinstance(said, list):
        return "string" if "string" in said else (said[0] if said else None)
    if isinstance(said, str):
        return said
    kinds = {_json_type(b) for b in schema.get("anyOf", []) if isinstance(b, dict)} - {"null"}
    if len(kinds) == 1:
        return kinds.pop()
    return "string" if "string" in kinds else None


QUOTED = re.compile(r"""'([^'\s]{2,40})'|"([^"\s]{2,40})"|`([^`\s]{2,40})`""")


def shape_of_examples(description: str) -> re.Pattern[str] | None:
    """A pattern of the shape of the description's quoted examples that have one
    ('America/New_York' -> capitalised words joined by / and _; '14:30' -> digits
    around a colon); None if it quotes none. Plain words ('UTC') have no shape a
    question's words would not all match."""
    shapes: dict[str, None] = {}
    for m in QUOTED.finditer(description):
        example = next(g for g in m.groups() if g)
        if example.isalpha() or not re.search(r"[A-Za-z0-9]", example):
            continue
        shape = re.sub(r"(\[A-Z]|\[a-z]|\\d)(?:\1)+", r"\1+", _classes(example))
        shapes[shape] = None
    if not shapes:
        return None
    return re.compile(rf"(?<![\w/:.-])(?:{'|'.join(shapes)})(?![\w/:-])")


def _classes(example: str) -> str:
    return "".join(
        "[A-Z]"
        if c.isupper()
        else "[a-z]"
        if c.islower()
        else r"\d"
        if c.isdigit()
        else re.escape(c)
        for c in example
    )


def fill_arguments(params: tuple[Param, ...], question: str) -> dict[str, str] | None:
    """Arguments found in the question, or None when a required id is missing.
    A reason the question does not give is left out (the model asks for it, or
    validation says it is missing); other free text gets the whole question."""
    args: dict[str, str] = {}
    for p in params:
        value = find_value(p, question, taken=tuple(args.values()))
        if value is None:
            if p.is_id:
                return None
            continue
        args[p.name] = value
    return args


def find_value(param: Param, text: str, taken: tuple[str, ...] = ()) -> str | None:
    """The value of one parameter in `text`, or None if the text does not give it.
    `taken`: values other parameters of the call have (a shaped value goes to one).
    Words fill only a string: a value of another type (a list, a number) is never found."""
    if param.kind not in ("string", None):
        return None
    if param.pattern is not None:
        return find_id(param.pattern, text)
    if param.shape is not None:
        return next((m for m in find_ids(param.shape, text) if m not in taken), None)
    if param.is_reason:
        return find_reason(text, param.tool_words)
    return text


# An id right after "like" is an example ("order ID (6 digits, like 123456)"),
# not the one the customer means.
_EXAMPLE_BEFORE = re.compile(r"\blike\s*$", re.IGNORECASE)


def find_id(pattern: re.Pattern[str], text: str) -> str | None:
    """The first id in `text` that is not an example."""
    return next(iter(find_ids(pattern, text)), None)


def find_ids(pattern: re.Pattern[str], text: str) -> list[str]:
    """Every id in `text` that is not an example, each once, in order ("orders
    123456 and 234567")."""
    found: list[str] = []
    for m in pattern.finditer(text):
        if not _EXAMPLE_BEFORE.search(text[: m.start()]) and m.group(0) not in found:
            found.append(m.group(0))
    return found


# Where one clause of a message ends and the next begins: punctuation, a
# conjunction that introduces a reason, or "and"/"but" before a new subject.
_CLAUSE_BREAK = re.compile(
    r"[,;:!?()]+|\.(?:\s+|$)|\s+[-–—]+\s+"
    r"|\s+(?=(?:because|since|cause|as|due to)\s)"
    r"|\s+(?=(?:and|but|so)\s+(?:i|i'm|i'd|we|it|it's|they|the|my)\s)",
    re.IGNORECASE,
)
_LEADING_CONJUNCTION = re.compile(r"^(?:and|but|so|because|since|cause|as|due to)\s+", re.I)
# Words that carry no reason: greetings, politeness, pronouns and auxiliaries.
_FILLER = frozenset(
    """a am an and are as at be been but by can could do does for from hello hey hi i i'd
    i'm is it it's its just me my now of ok okay on or our please reason so thank thanks
    that the this to too us was we were will with would yes you your""".split()  # noqa: SIM905
)
MIN_REASON_CHARS = 3


def find_reason(text: str, tool_words: tuple[str, ...] = ()) -> str | None:
    """The customer's reason: the clauses of `text` that say something beyond the
    request itself (which names the tool's words, "return", or the id), joined.
    A clause holding an id counts only when nothing else is left ("order 123456
    arrived broken, please return it")."""
    clauses = [_LEADING_CONJUNCTION.sub("", c.strip()) for c in _CLAUSE_BREAK.split(text)]
    said = [c for c in clauses if _says_something(c) and not _names_tool(c, tool_words)]
    without_ids = [c for c in said if not re.search(r"\d{3,}", c)]
    reason = ", ".join(without_ids or said).strip(" .")
    return reason if len(reason) >= MIN_REASON_CHARS else None


def _says_something(clause: str) -> bool:
    words = re.findall(r"[a-z][a-z']+", clause.lower())
    return any(w not in _FILLER for w in words)


def _names_tool(clause: str, tool_words: tuple[str, ...]) -> bool:
    words = re.findall(r"[a-z]+", clause.lower())
    return any(w.startswith(t) for w in words for t in tool_words if len(t) >= 3)
