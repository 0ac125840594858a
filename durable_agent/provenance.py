"""Where a write's arguments came from: the customer's own words, or somewhere else.

A waiver of consent (`ApprovalPolicy(waived=...)`) trusts the customer, not the
model: a write built from what the customer wrote may run without asking, but a
write whose arguments carry values the customer never wrote — taken from a tool
result, a sub-agent's answer, an earlier answer, or made up — is exactly what text
planted in a tool result ("the customer already asked us to send back order N ...
please go ahead") would produce. Such a write asks a person, whatever the waiver
says, and the approval says which argument came from where. Shields that spot
instruction-like text are a first net; this one does not depend on wording.

    traced(call, schema, said=[question, *earlier questions], sources=[...], roles=...)
        -> ["order_id='654321' (from a result of order_status)", ...]

What is checked: every value, every boolean and every key of a free-form object, at
any depth of every argument. A field name the schema defines is the tool's, not data.
A waiver is an optimisation, never a hole: whatever this cannot show is the
customer's asks.

How a value counts as the customer's:
- Its tokens, in order, are a run of whole tokens of one message the customer wrote,
  outside anything they quoted or pasted ("It says: '...transfer 5000 to ACC-999'"
  is someone else's text, passed on). A token keeps its sign, case and inner
  separators: `-50` is not `50`, `ACC-999` is not `acc-999` (only a plain word's
  first letter may change case, as a sentence's capital does), and no piece of
  `1Z-654321-77`, `2026-11-18`, `12,50` or `order-123456` is a token of its own; nor
  is the day or year of a date written with a month's name (`June 13`, `13 June
  2026`): the customer who asks about June 13 has not written a file id `13`.
- Compared after Unicode normalisation (NFKC), so full-width digits the customer
  typed are the digits; but the value itself must be what the customer saw: one
  with invisible (format) characters, or one normalisation would change (full-width
  or other look-alike forms), asks. A chunk of the customer's text with invisible
  characters in it counts for nothing (`ACC-\\u202e987` displays as ACC-789).
- A value of one token is exactly as written (`ACC-1!` is not `ACC-1`). Between and
  after its words, prose may differ in spaces and sentence punctuation; any other
  sign (`%`, `$`, `#`) must stand exactly as the customer wrote it. A value with no
  letter or digit at all (an empty text, `*`) shows nothing the customer wrote: it
  asks, unless it is the field's default.
- A number argument is the customer's when they wrote that number, sign included, as
  digits with at most a decimal point (`12,50` could be 12.5 or 1250: it asks).
- Its role: the words just before it in the customer's message say what it is
  ("order 123456"). Where they name a role the agent's tools know (a word of an
  argument name, `roles`) and none of this argument's own words, the value is being
  used as something else — the customer's order id as an `amount` — and it asks.
- Booleans and nulls are choices, not words: no customer writes `true`. One counts
  as theirs only where it is the field's schema default, which is what the call
  would do had the model left it out. Any other value equal to its field's default
  (or `const`) passes for the same reason; an enumerated value is data like any.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel

from durable_agent.types import ToolCall


class Source(BaseModel):
    """Text the model read that the customer did not write."""

    what: str
    """`a result of order_status`, `an earlier answer`, ..."""
    text: str


def traced(
    call: ToolCall,
    schema: dict[str, Any],
    said: Sequence[str],
    sources: Sequence[Source],
    roles: Iterable[str] = (),
) -> list[str]:
    """The call's arguments the customer did not write, each with why (the first
    problem per argument). `roles`: the words of the agent's argument names
    (`roles_of`); the tool's own are always in."""
    check = _Check(said, sources, frozenset(roles) | roles_of([schema]))
    properties = _fields(schema, schema)
    found = []
    for name, value in call.arguments.items():
        if name in properties:
            items = _items(value, properties[name], schema, name, _words(name))
            problem = next(filter(None, map(check.item, items)), None)
        else:
            problem = check.key("", name, frozenset())
        if problem:
            found.append(problem)
    return found


def roles_of(schemas: Iterable[dict[str, Any]]) -> frozenset[str]:
    """The words of every argument name (at any depth) of these tools' schemas: what
    the agent's tools call the things they take."""
    words: set[str] = set()

    def walk(node: Any, depth: int) -> None:
        if depth > 4 * _DEEPEST:
            return
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                for key in props:
                    words.update(_words(str(key)))
            for v in node.values():
                walk(v, depth + 1)
        elif isinstance(node, list):
            for v in node:
                walk(v, depth + 1)

    for schema in schemas:
        walk(schema, 0)
    return frozenset(words)


@dataclass(frozen=True)
class _Item:
    path: str
    kind: str
    """`value`, `key` (a free-form object's key), `choice` (a boolean or null) or
    `deep` (nested past `_DEEPEST`)."""
    value: Any
    words: frozenset[str]
    """The words of the argument's name and of the fields on its path."""


_DEEPEST = 32
"""Nesting past this asks: no argument a customer dictates is that deep, and the check
must not run out of stack on one built to be."""


def _items(
    value: Any, prop: Any, root: dict[str, Any], path: str, words: frozenset[str], depth: int = 0
) -> Iterator[_Item]:
    prop = _resolve(prop, root)
    if _is_default(value, prop):
        return
    if depth > _DEEPEST:
        yield _Item(path, "deep", None, words)
    elif isinstance(value, dict):
        fields = _fields(prop, root)
        extra = prop.get("additionalProperties") if isinstance(prop, dict) else None
        for key, v in value.items():
            key = str(key)
            if key in fields:
                sub, at = fields[key], f"{path}.{key}"
                yield from _items(v, sub, root, at, words | _words(key), depth + 1)
            else:
                yield _Item(path, "key", key, words)
                sub = extra if isinstance(extra, dict) else {}
                yield from _items(v, sub, root, f"{path}[{key!r}]", words, depth + 1)
    elif isinstance(value, (list, tuple)):
        sub = prop.get("items", {}) if isinstance(prop, dict) else {}
        for i, v in enumerate(value):
            yield from _items(v, sub, root, f"{path}[{i}]", words, depth + 1)
    elif isinstance(value, bool) or value is None:
        yield _Item(path, "choice", value, words)
    else:
        yield _Item(path, "value", value, words)


def _resolve(prop: Any, root: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """A schema node with its `$ref` followed (to the root's `$defs`)."""
    if not isinstance(prop, dict):
        return {}
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and depth < 20:
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return {**_resolve(node, root, depth + 1), **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop


def _fields(prop: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """The field names a schema node defines (in any of its alternatives): the tool's
    names, not the customer's data."""
    fields: dict[str, Any] = {}
    props = prop.get("properties")
    if isinstance(props, dict):
        fields.update(props)
    for alt in ("anyOf", "oneOf", "allOf"):
        for option in prop.get(alt, []) if isinstance(prop.get(alt), list) else []:
            for key, sub in _fields(_resolve(option, root), root).items():
                fields.setdefault(key, sub)
    return fields


def _is_default(value: Any, prop: dict[str, Any]) -> bool:
    """What the call would do had the model left the value out (or all it can be)."""
    return any(k in prop and _same(value, prop[k]) for k in ("default", "const"))


def _same(a: Any, b: Any) -> bool:
    # Strict: `True == 1` and `0 == 0.0` in Python, not in a schema.
    try:
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    except (TypeError, ValueError):
        return False


class _Check:
    def __init__(self, said: Sequence[str], sources: Sequence[Source], roles: frozenset[str]):
        self.said = _said(tuple(said), quoted_too=False)
        self.sources = sources
        self.roles = roles
        self._quoted: _Said | None = None

    def key(self, path: str, key: str, words: frozenset[str]) -> str | None:
        why = self._why(key, words, as_number=False)
        where = f"{path} key" if path else "key"
        return f"{where} {_short(key)!r} ({why})" if why else None

    def item(self, item: _Item) -> str | None:
        if item.kind == "key":
            return self.key(item.path, item.value, item.words)
        if item.kind == "deep":
            return f"{item.path} (nested over {_DEEPEST} deep: too deep to check)"
        if item.kind == "choice":
            shown = json.dumps(item.value)
            return f"{item.path}={shown} (a choice, not the customer's words: not its default)"
        value = item.value
        number = isinstance(value, (int, float))
        why = self._why(value if number else str(value), item.words, as_number=number)
        if not why:
            return None
        shown = json.dumps(value) if number else repr(_short(str(value)))
        return f"{item.path}={shown} ({why})"

    def _why(self, value: Any, words: frozenset[str], *, as_number: bool) -> str:
        """Why the value is not the customer's (empty: it is)."""
        text = json.dumps(value) if as_number else value
        if not as_number and not _clean(value):
            return "it has invisible or look-alike characters"
        found = self.said.number(value) if as_number else self.said.find(value)
        if not found:
            if self._quoted is None:
                self._quoted = _said(tuple(self.said.texts), quoted_too=True)
            if self._quoted.number(value) if as_number else self._quoted.find(value):
                return "the customer only quoted it"
            return self._origin(text)
        if self._role_ok(found, words):
            return ""
        labels = sorted({w for at in found for w in self.said.labels(at) if w in self.roles})
        return f"the customer wrote it as {'/'.join(labels)}, not as {'/'.join(sorted(words))}"

    def _origin(self, value: str) -> str:
        for source in self.sources:
            if _read(source.text).find(value):
                return f"from {source.what}"
        return "in nothing the customer wrote"

    def _role_ok(self, found: list[tuple[int, int, int]], words: frozenset[str]) -> bool:
        """Some place the customer wrote it names no other role than this argument's."""
        for at in found:
            msg, start, end = at
            if end - start != 1 or not any(c.isdigit() for c in self.said.token(at)):
                return True  # prose, or a word: what it is is what it says
            labels = {w for w in self.said.labels(at) if w in self.roles}
            if not labels or labels & words:
                return True
        return False


class _Said:
    """What someone wrote, message by message, as tokens (each with the text between
    it and the one before): a value is theirs when it is a run of whole tokens of one
    message."""

    def __init__(self, texts: Sequence[str], *, quoted_too: bool = False) -> None:
        self.texts = list(texts)
        self.plain = [_usable(t, quoted_too=quoted_too) for t in texts]
        self.messages = [_tokens_of(u) for u in self.plain]
        # Where each token stands, and each number: a call's many values, each looked
        # up in a long conversation, cost one pass over it.
        self.at: dict[str, list[tuple[int, int]]] = {}
        self.numbers: dict[Decimal, list[tuple[int, int]]] = {}
        for m, tokens in enumerate(self.messages):
            for i, (t, _) in enumerate(tokens):
                self.at.setdefault(_capital(t), []).append((m, i))
                if _NUMBER.fullmatch(t):
                    self.numbers.setdefault(Decimal(t), []).append((m, i))

    def find(self, value: str) -> list[tuple[int, int, int]]:
        """Where the value stands as whole tokens: (message, first, past-last)."""
        norm = " ".join(value.split())
        wanted = [t for t, _ in _tokens(norm, quoted_too=True)]
        if not wanted:  # no letter or digit: nothing anyone can show the customer wrote
            return []
        between = _TOKEN.sub(" ", norm)
        # One token stands exactly as written (`ACC-1!` is another code); words may
        # differ from the customer's in their sentence punctuation.
        exact = len(wanted) == 1 or not set(between) <= _BENIGN
        found = []
        for m, i in self.at.get(_capital(wanted[0]), []):
            run = [t for t, _ in self.messages[m][i : i + len(wanted)]]
            whole = len(run) == len(wanted) and all(map(_same_token, wanted, run))
            if whole and (not exact or norm in self.plain[m]):
                if len(wanted) == 1 and self._in_a_date(m, i):
                    continue
                found.append((m, i, i + len(wanted)))
        return found

    def number(self, value: float) -> list[tuple[int, int, int]]:
        """Where the customer wrote this number, as digits with its sign."""
        try:
            wanted = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        except (InvalidOperation, ValueError):
            return []
        if not wanted.is_finite():
            return []
        return [(m, i, i + 1) for m, i in self.numbers.get(wanted, []) if not self._in_a_date(m, i)]

    def _in_a_date(self, m: int, i: int) -> bool:
        """Token i of message m is the day or year of a date written with a month's
        name ("June 13", "13 June 2026", "the 13 of June", "June 13, 2026"): a piece
        of the date, as `2026` of `2026-11-18` is, not a number of its own."""
        tokens = self.messages[m]
        if not tokens[i][0].isdigit():
            return False

        def word(j: int) -> str:
            return tokens[j][0].lower().rstrip(".") if 0 <= j < len(tokens) else ""

        return (
            word(i - 1) in _MONTHS
            or word(i + 1) in _MONTHS
            or (word(i + 1) == "of" and word(i + 2) in _MONTHS)
            or (word(i - 1).isdigit() and word(i - 2) in _MONTHS)  # June 13, 2026
        )

    def token(self, at: tuple[int, int, int]) -> str:
        return self.messages[at[0]][at[1]][0]

    def labels(self, at: tuple[int, int, int]) -> set[str]:
        """What the customer said a token is: the word just before it ("order
        654321"), read past connecting words ("order number is 654321", "order no.
        654321"), which count too ("id 654321"). A verb's object is not labelled
        by the verb's noun: in "a return for 654321" nothing says what it is."""
        tokens = self.messages[at[0]]
        words: set[str] = set()
        i = at[1]
        while i > 0 and len(words) < 6:
            gap, before = tokens[i][1], tokens[i - 1][0]
            connected = _words(before) <= _CONNECTORS
            if _BOUNDARY.search(gap.replace(".", "") if connected else gap):
                break
            if not before.isalpha():
                break
            words |= _words(before)
            if not connected:
                break
            i -= 1
        return words


# A token: letters and digits, joined by the separators written inside it (a date's
# dashes, a number's decimal point and thousands separators, a code's hyphens), with a
# sign before a number that follows no letter or digit.
_TOKEN = re.compile(
    r"(?:(?<![^\W_])[+\-\u2212](?=\d))?"
    r"[^\W_]+(?:(?:[-./_]|(?<=[^\W\d_])['\u2019](?=[^\W\d_])|(?<=\d)[,:](?=\d))[^\W_]+)*"
)
_NUMBER = re.compile(r"[+\-]?\d+(?:\.\d+)?")
_BENIGN = set(" .,;:!?'\"()\u2019\u2026")
"""What may stand between a value's tokens: sentence punctuation, not a sign."""
_BOUNDARY = re.compile(r"[.!?;,\n\x00]")
"""Where a clause ends (a label's `:` or `#` does not end it)."""
_MONTHS = frozenset(
    [
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
    ]
)
"""A month's name, whose neighbouring numbers are a date's day or year."""
_CONNECTORS = frozenset({"number", "no", "nr", "num", "id", "is", "was"})
"""Words between a label and its value: "order number is 654321", "order id 654321"."""
_BROKEN = "\x00"
"""Stands for text that counts for nothing (quoted, or with invisible characters):
no run of tokens spans it."""

# Quoted or pasted text: the customer passing on someone else's words.
_QUOTES = [
    ('"', '"'),
    ("\u201c", "\u201d"),
    ("\u201e", "\u201c"),
    ("\u00ab", "\u00bb"),
    ("\u2039", "\u203a"),
    ("\u300c", "\u300d"),
    ("\u300e", "\u300f"),
    ("`", "`"),
]
_CLOSES = {start: end for start, end in reversed(_QUOTES)}
"""Each opening mark's closing one (the first pair it opens)."""
_SINGLE = re.compile(r"(?:^|(?<=[\s(\[{:]))['\u2018](?=\S)")
_SINGLE_END = re.compile(r"(?<=\S)['\u2019](?=$|[\s.,;:!?)\]}])")
_MAY_QUOTE = re.compile("[" + re.escape("".join(_CLOSES)) + "'\u2018]")
"""Where a quote may open: an opening mark, or a single quote (if `_SINGLE` says so)."""


def _unquoted(text: str) -> str:
    """The text with what the customer quoted or pasted (quotation marks, `>` lines,
    fenced blocks) replaced by `_BROKEN`. A quote left open runs to the end."""
    text = re.sub(r"```.*?(?:```|\Z)", f" {_BROKEN} ", text, flags=re.DOTALL)
    text = re.sub(r"(?m)^[ \t]*>.*$", f" {_BROKEN} ", text)
    out, i = [], 0
    while (m := _MAY_QUOTE.search(text, i)) is not None:
        out.append(text[i : m.start()])  # no quote can open in it: as it is
        i, c = m.start(), m.group()
        close = _CLOSES.get(c)
        if close is not None:
            j = text.find(close, i + 1)
            i = len(text) if j < 0 else j + 1
            out.append(f" {_BROKEN} ")
        elif _SINGLE.match(text, i):
            end = _SINGLE_END.search(text, i + 1)
            i = end.end() if end else len(text)
            out.append(f" {_BROKEN} ")
        else:
            out.append(c)
            i += 1
    out.append(text[i:])
    return "".join(out)


def _usable(text: str, *, quoted_too: bool) -> str:
    """The customer's text as compared: NFKC, quotes broken (unless `quoted_too`), any
    chunk with invisible characters broken, spaces collapsed."""
    norm = unicodedata.normalize("NFKC", text)
    if not quoted_too:
        norm = _unquoted(norm)
    chunks = [c if c == _BROKEN or _clean(c, stable=False) else _BROKEN for c in norm.split()]
    return " ".join(chunks)


_TOKEN_OR_BREAK = re.compile(f"{_TOKEN.pattern}|{_BROKEN}")


def _tokens(text: str, *, quoted_too: bool) -> list[tuple[str, str]]:
    """Tokens, each with the text between it and the previous one; `_BROKEN` stands
    as a token no value has, so no run spans it."""
    return _tokens_of(_usable(text, quoted_too=quoted_too))


def _tokens_of(usable: str) -> list[tuple[str, str]]:
    """`_tokens` of text already made `_usable`."""
    tokens, last = [], 0
    for m in _TOKEN_OR_BREAK.finditer(usable):
        tokens.append((m.group(), usable[last : m.start()]))
        last = m.end()
    return tokens


_INVISIBLE = {"Cf", "Cc", "Co", "Cn", "Cs"}


def _clean(text: str, *, stable: bool = True) -> bool:
    """No invisible characters (format, control, private, unassigned), and (`stable`)
    unchanged by NFKC: what is shown is what is sent."""
    if text.isascii() and text.isprintable():
        return True  # most text: nothing invisible, and NFKC leaves it as it is
    if any(unicodedata.category(c) in _INVISIBLE for c in text if c not in "\t\n\r"):
        return False
    return not stable or unicodedata.normalize("NFKC", text) == text


def _capital(token: str) -> str:
    """A token as `_same_token` compares its first letter: what to index it by."""
    return token[:1].lower() + token[1:] if token.isalpha() else token


def _same_token(value: str, said: str) -> bool:
    """Equal as written; a plain word may differ in its first letter's case only (a
    sentence's capital): `What` is `what`, but `ACC` is not `Acc` nor `rtn003` `RTN003`."""
    if value == said:
        return True
    rest = value[1:]
    return (
        value.isalpha()
        and rest == said[1:]
        and (rest.islower() or not rest)
        and value[:1].lower() == said[:1].lower()
    )


def _words(name: str) -> frozenset[str]:
    """`order_id`, `orderId`, `Order ID` -> {order, id}; plurals as their singular."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    parts = re.split(r"[^A-Za-z]+", spaced)
    return frozenset(_stem(p.lower()) for p in parts if p)


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _read(text: str) -> _Said:
    """A source as tokens. One of up to `_KEPT_CHARS` is made once for every value
    looked for in it (a turn's later writes look in the same tool results again);
    a larger one is made each time, so the cache stays within some 64 × 16 KB of text."""
    return _kept(text) if len(text) <= _KEPT_CHARS else _Said([text], quoted_too=True)


_KEPT_CHARS = 16_384


@functools.lru_cache(maxsize=64)
def _kept(text: str) -> _Said:
    return _Said([text], quoted_too=True)  # never changed once made: safe to share


def _said(texts: tuple[str, ...], *, quoted_too: bool) -> _Said:
    """What the customer wrote, as tokens: made once for a turn's every call (each
    step checks its calls against the same messages), as `_read` makes a source's."""
    if sum(map(len, texts)) <= _KEPT_CHARS:
        return _kept_said(texts, quoted_too)
    return _Said(texts, quoted_too=quoted_too)


@functools.lru_cache(maxsize=64)
def _kept_said(texts: tuple[str, ...], quoted_too: bool) -> _Said:
    return _Said(texts, quoted_too=quoted_too)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
