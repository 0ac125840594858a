"""Values made from a JSON schema: a tool's arguments, a typed turn's value.

    arguments_for(spec)      -> Arguments(values, note)   a dict valid for the tool, or
                                                          None and why it cannot be made
    value_for(schema)        -> a value valid for the schema, or CannotMake

What it follows: `$ref` into `$defs`, `allOf`, `anyOf`/`oneOf` (the first option that
works), `const`, `enum`, `examples`, every JSON type; for strings `minLength`,
`maxLength`, `format` (date, date-time, time, email, uri, uuid, ipv4, ipv6, hostname,
duration, ...) and `pattern` (a string the pattern matches, made from its parse tree);
for numbers the bounds, exclusive or not, and `multipleOf`; for arrays `items`,
`prefixItems`, `minItems`, `maxItems`, `uniqueItems`; for objects `required`,
`properties` and `additionalProperties`. Optional properties are filled when they can
be. Every value is checked against the schema with `jsonschema` before it is given:
what it cannot make valid (a lookaround in a pattern, a `not`, a recursion deeper than
`MAX_DEPTH`, a value over `MAX_VALUES` parts or `MAX_CHARS` characters, a schema no
validator would take) is a `CannotMake` that says where and why, never a wrong value.

With `text` (the customer's words), a value of an enum or a pattern found in it is tried
first. Deterministic: the same schema, `seed` and `text` give the same value (`seed`
picks another enum member or union option first).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, NamedTuple

from durable_agent.tools import ToolSpec

MAX_DEPTH = 12
"""How deep a made value nests (a recursive schema stops here)."""
MAX_VALUES = 10_000
"""How many values (items, properties, scalars) one made value holds at most."""
MAX_CHARS = 10_000
"""The longest string it makes (a `minLength` or a pattern's repeat beyond it is refused)."""

FORMATS: dict[str, str] = {
    "date": "2026-01-02",
    "date-time": "2026-01-02T03:04:05Z",
    "time": "03:04:05Z",
    "duration": "P1D",
    "email": "test@example.com",
    "idn-email": "test@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/",
    "iri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "iri-reference": "https://example.com/",
    "uri-template": "https://example.com/{id}",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "json-pointer": "/a",
    "relative-json-pointer": "0",
    "regex": "^a$",
    "password": "secret",
    "binary": "data",
    "byte": "ZGF0YQ==",
    "base64": "ZGF0YQ==",
    "path": "/tmp/file",
    "json-string": "{}",
}
"""A value of each string format (the first of a list whose items must differ)."""


class CannotMake(Exception):
    """No valid value could be made; the message names where (`path`) and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path or 'the value'}: {reason}")
        self.path = path
        self.reason = reason


class Arguments(NamedTuple):
    values: dict[str, Any] | None
    """Arguments valid for the tool's schema; None when they cannot be made."""
    note: str = ""
    """Why they cannot be made (which field, what it asks for)."""


def arguments_for(spec: ToolSpec, seed: int = 0, text: str = "") -> Arguments:
    """Arguments valid for the tool's JSON schema, or why none can be made. `text`: the
    customer's words; a value of a pattern or an enum found in them is taken first, as
    a model would (and as the shields expect of an id: one the customer gave)."""
    try:
        made = value_for(spec.parameters, seed=seed, text=text)
    except CannotMake as e:
        return Arguments(None, f"{spec.name}: cannot make {e}")
    if not isinstance(made, dict):
        return Arguments(None, f"{spec.name}: its schema does not describe an object")
    return Arguments(made)


def value_for(schema: Any, *, seed: int = 0, text: str = "") -> Any:
    """A value valid for `schema` (checked with `jsonschema`); `CannotMake` otherwise.
    `text`: words to find a pattern's or an enum's value in first."""
    maker = _Maker(schema if isinstance(schema, dict) else {}, seed, text)
    try:
        value = maker.make(schema, "", "", 0, 0)
    except CannotMake:
        raise
    except UNREADABLE as e:
        raise CannotMake("", _unreadable(e)) from None
    problem = first_problem(schema, value)
    if problem:
        raise CannotMake(*problem)
    return value


UNREADABLE = (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError)
"""What a schema no validator would take raises here (`minItems: "two"`): it is said in
the note, never a traceback."""


def _unreadable(e: BaseException) -> str:
    return f"its schema cannot be read ({type(e).__name__}: {_short(str(e))})"


class _Maker:
    def __init__(self, root: dict[str, Any], seed: int, text: str = "") -> None:
        self.root = root
        self.seed = seed
        self.text = text
        self.made = 0

    def make(self, schema: Any, path: str, hint: str, depth: int, variant: int) -> Any:
        """A value for `schema` at `path` (`hint`: the property's name; `variant`: the
        item's index, for items that must differ)."""
        if depth > MAX_DEPTH:
            raise CannotMake(path, f"nested deeper than {MAX_DEPTH} levels (a recursive schema)")
        self.made += 1
        if self.made > MAX_VALUES:
            raise CannotMake(path, f"the value would hold over {MAX_VALUES:,} values")
        if schema is True or schema == {}:
            return _text(hint, variant)
        if schema is False or not isinstance(schema, dict):
            raise CannotMake(path, "the schema allows no value")
        schema = self._resolved(schema, path)
        if "const" in schema:
            return schema["const"]
        candidates = self._candidates(schema, path, hint, depth, variant)
        problems: list[CannotMake] = []
        for candidate in candidates:
            try:
                value = candidate()
            except CannotMake as e:
                problems.append(e)
                continue
            except UNREADABLE as e:
                problems.append(CannotMake(path, _unreadable(e)))
                continue
            problem = first_problem(schema, value, self.root)
            if problem is None:
                return value
            problems.append(CannotMake(_joined(path, problem[0]), problem[1]))
        if problems:
            raise problems[0]
        raise CannotMake(path, "no type it can make")

    def _resolved(self, schema: dict[str, Any], path: str) -> dict[str, Any]:
        """`$ref` followed and `allOf` merged into one schema."""
        for _ in range(MAX_DEPTH):
            if "$ref" not in schema and "allOf" not in schema:
                return schema
            if "$ref" in schema:
                target = self._target(str(schema["$ref"]), path)
                rest = {k: v for k, v in schema.items() if k != "$ref"}
                schema = _merged(target, rest)
            if "allOf" in schema:
                parts = schema["allOf"]
                rest = {k: v for k, v in schema.items() if k != "allOf"}
                for part in parts if isinstance(parts, list) else []:
                    rest = _merged(rest, self._resolved(part, path) if part is not True else {})
                schema = rest
        raise CannotMake(path, "its $ref chain is too long")

    def _target(self, ref: str, path: str) -> dict[str, Any]:
        if not ref.startswith("#"):
            raise CannotMake(path, f"$ref {ref!r} is not in the schema itself")
        node: Any = self.root
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise CannotMake(path, f"$ref {ref!r} names nothing")
        return node

    def _candidates(
        self, schema: dict[str, Any], path: str, hint: str, depth: int, variant: int
    ) -> Iterator[Any]:
        """Ways to make a value, in the order they are tried (each is checked)."""
        if self.text and variant == 0:
            for found in _found(schema, self.text):
                yield lambda found=found: found
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            members = schema["enum"]
            start = self.seed + variant
            for i in range(len(members)):
                yield lambda i=i: members[(start + i) % len(members)]
            return
        examples = schema.get("examples")
        if isinstance(examples, list) and variant == 0:
            for example in examples:
                yield lambda example=example: example
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                rest = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                for option in _rotated(_nulls_last(options), self.seed):
                    merged = _merged(rest, option if isinstance(option, dict) else {})
                    yield lambda m=merged: self.make(m, path, hint, depth + 1, variant)
                return
        for kind in _rotated(_types(schema), self.seed):
            yield lambda kind=kind: self._of_type(kind, schema, path, hint, depth, variant)

    def _of_type(
        self, kind: str, schema: dict[str, Any], path: str, hint: str, depth: int, variant: int
    ) -> Any:
        if kind == "object":
            return self._object(schema, path, depth, variant)
        if kind == "array":
            return self._array(schema, path, hint, depth)
        if kind == "string":
            return _string(schema, path, hint, variant)
        if kind in ("integer", "number"):
            return _number(schema, path, kind == "integer", variant)
        if kind == "boolean":
            return variant % 2 == 1
        if kind == "null":
            return None
        raise CannotMake(path, f"unknown type {kind!r}")

    def _object(
        self, schema: dict[str, Any], path: str, depth: int, variant: int
    ) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        required = [r for r in schema.get("required") or [] if isinstance(r, str)]
        extra = schema.get("additionalProperties", True)
        made: dict[str, Any] = {}
        for name, sub in properties.items():
            try:
                made[name] = self.make(sub, _joined(path, name), name, depth + 1, variant)
            except CannotMake:
                if name in required:
                    raise
                # An optional property it cannot make valid is left out: its default holds.
        for name in required:
            if name not in made:
                if extra is False:
                    raise CannotMake(_joined(path, name), "required, but no schema allows it")
                made[name] = self.make(extra, _joined(path, name), name, depth + 1, 0)
        least = schema.get("minProperties") or 0
        n = 0
        while len(made) < least and extra is not False:
            key = f"key{n}"
            made.setdefault(key, self.make(extra, _joined(path, key), key, depth + 1, n))
            n += 1
        return made

    def _array(self, schema: dict[str, Any], path: str, hint: str, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuples
            prefix, items = items, schema.get("additionalItems", True)
        least = int(schema.get("minItems") or 0)
        most = schema.get("maxItems")
        if least > MAX_VALUES:
            raise CannotMake(path, f"it asks for {least:,} items, over {MAX_VALUES:,}")
        # One item beyond what is required shows what an item looks like.
        n = max(least, len(prefix), 0 if items is False else 1)
        if most is not None:
            n = min(n, int(most))
        made = []
        for i in range(n):
            sub = prefix[i] if i < len(prefix) else items
            made.append(self.make(sub, _joined(path, str(i)), hint, depth + 1, i))
        return made


def _found(schema: dict[str, Any], text: str) -> list[str]:
    """Values the text holds of a string's enum or pattern (its anchors dropped, whole
    words only, any case), in the order they appear."""
    members = [m for m in schema.get("enum") or [] if isinstance(m, str) and m]
    if members:
        hits = [(text.lower().find(m.lower()), m) for m in members]
        return [m for at, m in sorted(hits) if at >= 0 and _whole_word(text, at, len(m))]
    pattern = schema.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        return []
    body = pattern.removeprefix("^").removesuffix("$")
    try:
        finder = re.compile(rf"(?<![\w-])(?:{body})(?![\w-])", re.IGNORECASE)
        return [m.group(0) for m in finder.finditer(text) if m.group(0)][:3]
    except re.error:
        return []


def _whole_word(text: str, at: int, length: int) -> bool:
    before = text[at - 1] if at > 0 else " "
    after = text[at + length] if at + length < len(text) else " "
    return not (before.isalnum() or after.isalnum())


def _types(schema: dict[str, Any]) -> list[str]:
    """The types to try, the null type last (a value says more than a null)."""
    given = schema.get("type")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list) and given:
        return _nulls_last([t for t in given if isinstance(t, str)])
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return ["object"]
    if "items" in schema or "prefixItems" in schema:
        return ["array"]
    if any(k in schema for k in ("minimum", "maximum", "multipleOf", "exclusiveMinimum")):
        return ["number"]
    return ["string"]


def _nulls_last(options: list[Any]) -> list[Any]:
    def is_null(o: Any) -> bool:
        return o == "null" or (isinstance(o, dict) and o.get("type") == "null")

    return [o for o in options if not is_null(o)] + [o for o in options if is_null(o)]


def _rotated(items: list[Any], seed: int) -> list[Any]:
    if not items:
        return items
    k = seed % len(items)
    return items[k:] + items[:k]


def _merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two schemas that must both hold, as one (properties and requirements joined)."""
    out = dict(base)
    for key, value in more.items():
        if key == "properties" and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        elif key == "required" and isinstance(out.get(key), list):
            out[key] = list(dict.fromkeys([*out[key], *value]))
        else:
            out[key] = value
    return out


def _joined(path: str, name: str) -> str:
    return f"{path}.{name}" if path and name else path or name


def _text(hint: str, variant: int) -> str:
    base = re.sub(r"[^A-Za-z0-9]+", " ", hint).strip() or "text"
    return base if variant == 0 else f"{base} {variant}"


def _string(schema: dict[str, Any], path: str, hint: str, variant: int) -> str:
    least = int(schema.get("minLength") or 0)
    most = schema.get("maxLength")
    if least > MAX_CHARS:
        raise CannotMake(path, f"it asks for {least:,} characters, over {MAX_CHARS:,}")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        return _matching(pattern, least, most, path, variant)
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        return _formatted(fmt, variant)
    text = _text(hint, variant)
    if len(text) < least:
        text = (text + "x" * least)[:least]
    if most is not None:
        text = text[: int(most)]
    return text


def _formatted(fmt: str, variant: int) -> str:
    """A value of `fmt`; items that must differ get different ones."""
    value = FORMATS[fmt]
    if variant == 0:
        return value
    if fmt in ("date", "date-time"):
        return value.replace("-02", f"-{2 + variant % 27:02d}", 1)
    if fmt in ("email", "idn-email"):
        return f"test{variant}@example.com"
    if fmt.startswith(("uri", "iri")):
        return f"https://example.com/{variant}"
    if fmt in ("hostname", "idn-hostname"):
        return f"host{variant}.example.com"
    if fmt == "uuid":
        return value[: -len(str(variant))] + str(variant)
    if fmt == "ipv4":
        return f"192.0.2.{1 + variant % 254}"
    return value


# -- strings that a pattern matches -----------------------------------------------------

try:  # the parser behind `re`, as it is named since Python 3.11
    _parser: Any = importlib.import_module("re._parser")
except ImportError:  # Python 3.10
    _parser = importlib.import_module("sre_parse")

GROWTHS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Repeat counts tried, in order, for a pattern's `*`, `+` and `{m,n}` (each within its
bounds): the shortest match first, longer ones for a `minLength`."""

_CATEGORY = {
    "CATEGORY_DIGIT": "0",
    "CATEGORY_NOT_DIGIT": "a",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_SPACE": "a",
    "CATEGORY_WORD": "a",
    "CATEGORY_NOT_WORD": "-",
    "CATEGORY_LINEBREAK": "\n",
    "CATEGORY_NOT_LINEBREAK": "a",
}
_SPARE = "a0A_- .z9Z"
"""Characters tried for a negated class (`[^...]`) or a character that must differ."""


def _matching(pattern: str, least: int, most: Any, path: str, variant: int) -> str:
    """A string `pattern` matches (as JSON Schema does: anywhere in it), within the
    lengths; the shortest that fits first."""
    try:
        compiled = re.compile(pattern)
        tree = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        raise CannotMake(path, f"pattern {pattern!r} is not one Python can read") from None
    tried: set[str] = set()
    for grow in GROWTHS:
        try:
            text = _Regex(grow, variant).text(tree)
        except _Unsupported as e:
            why = f"pattern {pattern!r} uses {e}, which it cannot follow"
            raise CannotMake(path, why) from None
        for candidate in (text, text + "a" * max(0, least - len(text))):
            if candidate in tried:
                continue
            tried.add(candidate)
            fits = len(candidate) >= least and (most is None or len(candidate) <= int(most))
            if fits and compiled.search(candidate):
                return candidate
    limits = f" of {least} to {most} characters" if least or most is not None else ""
    raise CannotMake(path, f"no string{limits} matching {pattern!r} found")


class _Unsupported(Exception):
    pass


class _Regex:
    """Walks a parsed pattern, writing one string it matches."""

    def __init__(self, grow: int, shift: int = 0) -> None:
        self.grow = grow
        self.shift = shift
        """Moves each class's character along its range: items that must differ do."""
        self.groups: dict[int, str] = {}

    def text(self, tree: Any) -> str:
        return "".join(self._item(str(op), av) for op, av in tree)

    def _item(self, op: str, av: Any) -> str:
        if op == "LITERAL":
            return chr(av)
        if op == "NOT_LITERAL":
            return next(c for c in _SPARE if ord(c) != av)
        if op == "ANY":
            return "a"
        if op == "IN":
            return self._in_class(av)
        if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            count = max(lo, min(self.grow, hi))
            if count == 0:
                return ""
            piece = self.text(sub)
            if count * len(piece) > MAX_CHARS:
                raise _Unsupported(f"a repeat longer than {MAX_CHARS:,} characters")
            return piece + "".join(self.text(sub) for _ in range(count - 1))
        if op == "SUBPATTERN":
            group, sub = av[0], av[-1]
            made = self.text(sub)
            if group is not None:
                self.groups[group] = made
            return made
        if op == "ATOMIC_GROUP":
            return self.text(av)
        if op == "BRANCH":
            return self.text(av[1][0])
        if op in ("AT", "ASSERT", "ASSERT_NOT"):
            return ""  # anchors and lookarounds write nothing; the match is checked after
        if op == "GROUPREF":
            return self.groups.get(av, "")
        if op == "GROUPREF_EXISTS":
            group, yes, no = av
            return self.text(yes if group in self.groups else no) if no or yes else ""
        raise _Unsupported(op.lower())

    def _in_class(self, items: list[tuple[Any, Any]]) -> str:
        """A character of a class (`[a-z0-9_]`, `\\d`, `[^,]`)."""
        if any(str(op) == "NEGATE" for op, _ in items):
            positive = re.compile(_class_source(items))
            for c in _SPARE:
                if not positive.fullmatch(c):
                    return c
            raise _Unsupported("a negated class that leaves no plain character")
        op, av = items[0]
        if str(op) == "LITERAL":
            return chr(av)
        if str(op) == "RANGE":
            return chr(av[0] + self.shift % (av[1] - av[0] + 1))
        if str(op) == "CATEGORY" and str(av) == "CATEGORY_DIGIT":
            return str(self.shift % 10)
        if str(op) == "CATEGORY":
            return _CATEGORY.get(str(av), "a")
        raise _Unsupported(str(op).lower())


def _class_source(items: list[tuple[Any, Any]]) -> str:
    """The positive class of a negated one, as a pattern to test candidates against."""
    parts = []
    for op, av in items:
        kind = str(op)
        if kind == "LITERAL":
            parts.append(re.escape(chr(av)))
        elif kind == "RANGE":
            parts.append(f"{re.escape(chr(av[0]))}-{re.escape(chr(av[1]))}")
        elif kind == "CATEGORY":
            parts.append(_ESCAPES.get(str(av), ""))
    return "[" + "".join(parts) + "]" if parts else "(?!)"


_ESCAPES = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
}


# -- numbers -----------------------------------------------------------------------------


def _number(schema: dict[str, Any], path: str, integer: bool, variant: int) -> int | float:
    lo, lo_open = _bound(schema, "minimum", "exclusiveMinimum")
    hi, hi_open = _bound(schema, "maximum", "exclusiveMaximum")
    step = schema.get("multipleOf")
    if integer:
        first = (math.floor(lo) + 1 if lo_open else math.ceil(lo)) if lo is not None else None
        last = (math.ceil(hi) - 1 if hi_open else math.floor(hi)) if hi is not None else None
        start = first if first is not None else (min(1, last) if last is not None else 1)
        value: int | float = start + variant
    else:
        if lo is not None:
            start_f = lo + (((hi - lo) / 2 if hi is not None else 1.0) if lo_open else 0.0)
        elif hi is not None:
            start_f = min(1.5, hi - 1.0 if hi_open else hi)
        else:
            start_f = 1.5
        value = start_f + variant
    if isinstance(step, (int, float)) and step > 0:
        value = _multiple(value, step, integer)
    if (hi is not None and (value > hi or (hi_open and value >= hi))) or (
        lo is not None and (value < lo or (lo_open and value <= lo))
    ):
        raise CannotMake(path, f"no {'integer' if integer else 'number'} within its bounds")
    return value


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float | None, bool]:
    """A bound and whether it is open, in both drafts' spellings."""
    open_bound = schema.get(exclusive)
    if isinstance(open_bound, bool):  # draft 4: a flag on the inclusive bound
        return schema.get(inclusive), open_bound
    if isinstance(open_bound, (int, float)):
        closed = schema.get(inclusive)
        if isinstance(closed, (int, float)) and closed > open_bound:
            return closed, False
        return open_bound, True
    return schema.get(inclusive), False


def _multiple(value: float, step: float, integer: bool) -> int | float:
    """The first multiple of `step` at or above `value` that divides exactly in floating
    point too (`jsonschema` checks `value / step` is whole)."""
    k = math.ceil(Decimal(str(value)) / Decimal(str(step)))
    for n in range(k, k + 50):
        made = Decimal(n) * Decimal(str(step))
        candidate: int | float = int(made) if integer and made == int(made) else float(made)
        quotient = candidate / step
        if quotient == int(quotient) and (not integer or candidate == int(candidate)):
            return candidate
    return float(Decimal(k) * Decimal(str(step)))


# -- checking ----------------------------------------------------------------------------


def first_problem(
    schema: Any, value: Any, root: dict[str, Any] | None = None
) -> tuple[str, str] | None:
    """Where and why `value` does not fit `schema` (None: it fits). A part of a larger
    schema is checked with the root's `$defs` beside it, so its `$ref`s resolve."""
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        return None
    checked: Any = schema
    if root is not None and isinstance(schema, dict) and schema is not root:
        defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
        checked = {**defs, **schema}
    cls = jsonschema.validators.validator_for(checked)
    try:
        error = jsonschema.exceptions.best_match(cls(checked).iter_errors(value))
    except RecursionError:
        return "", "its schema nests too deep to check"
    except Exception as e:  # an invalid schema, a $ref that resolves nowhere
        return "", f"its schema cannot be checked ({_short(str(e))})"
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return where, _short(error.message)


def _short(message: str, limit: int = 160) -> str:
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
