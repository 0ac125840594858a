"""JSON schemas checked without letting one value stop the worker.

The runtime checks values against JSON schemas it did not write: an MCP server's tool
list, a tool described by a schema of its own (`tools.schema_tool`), a turn's output
type (any client that starts turns chooses it). `jsonschema` runs a schema's
`pattern` on Python's `re`, which backtracks while it holds the GIL: `^(a+)+$` met by
`"a" * 34 + "!"` ran for hours, and the worker with it (no other turn, no time limit,
no SIGTERM). Here every keyword that matches a regular expression (`pattern`,
`patternProperties`, and `additionalProperties` beside it) runs on pydantic-core's
Rust `regex`, whose matching is linear in the text; the rest of `jsonschema` is as it
was.

    checker = validator(schema)          # `UnusableSchema`, one line, if it cannot be
    for error in checker.iter_errors(v):  # checked here; cached by the schema's JSON
        ...

A schema is refused when it is loaded, naming the pattern and where it is, when:
- a pattern has look-around or backreferences (no linear engine has them), or does
  not compile;
- a pattern is wider than `MAX_PATTERN_WIDTH` (its atoms, counted repetitions
  multiplied out: `(?:.{0,50}){0,50}` is 2,500), whose automaton is so large that even
  linear matching takes seconds on a long text;
- `unevaluatedProperties` meets `patternProperties` (`jsonschema` matches those
  patterns for it on its own, with `re`).

A check gets a budget: its strings' lengths, each times the width of the pattern it
is matched against, at most `CHECK_BUDGET` together (a tenth of a second at worst);
a value past it is refused as too long to check. `uniqueItems` compares items by a
canonical form in linear time (`jsonschema` compares objects pairwise: 3,000 of them
took 18 s). A `$ref` resolves within the schema only: `jsonschema` would fetch a
remote one, with no time limit.

Patterns follow JSON Schema's rules: a pattern matches anywhere in the string unless
anchored (`^`, `$`). The syntax is Rust's, which reads ECMA-262 patterns without
look-around or backreferences; `\\d`, `\\w` and `\\s` are Unicode-aware, as in
pydantic and Python (ECMA-262: ASCII), and `$` is the end of the text (Python's `re`
also let a trailing newline through).
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_PATTERN_WIDTH = 1_000
"""The widest pattern taken: atoms, with counted repetitions multiplied out and
alternatives added up (`_shape`). Rust's matcher is linear in the text, but its cost
a character grows with the automaton: `(?:.{0,50}){0,50}x` took 7 s on 100,000
characters, `(?:.{0,30}){0,30}x` 0.03 s."""
CHECK_BUDGET = 2_000_000
"""What one check may match: its strings' lengths, each times its pattern's width,
together. Measured at most 5e-8 s a unit (the worst of some 25 patterns made to be
slow, at their widest): a tenth of a second, on a busy machine a few tenths."""
VALUE_KEYWORDS = ("const", "enum", "default", "examples")
"""Keywords whose values are instances, not schemas: their patterns are not checked."""


class UnusableSchema(ValueError):
    """A JSON schema this runtime cannot check: not a valid one, or a pattern no
    linear-time engine takes (the message names it and where it is)."""


class _TooCostly(Exception):
    """A check past its budget (`CHECK_BUDGET`)."""


# -- patterns -------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What a pattern's structure says of the cost of matching it."""

    width: int
    """Atoms, counted repetitions multiplied out, alternatives added up."""
    nested: bool
    """A repetition of something that itself repeats or has alternatives
    (`(a+)+`, `(a|aa)*`): exponential in a backtracking engine."""
    unbounded: int
    """Repetitions without an upper bound (`*`, `+`, `{n,}`)."""
    unbounded_words: bool
    """Every unbounded repetition is of one word character class (`\\d+`, `[a-z0-9]*`)."""
    spread: int
    """The product of the bounded repetitions' ranges: the ways one start may match."""


_COUNTED = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
_GROUP_OPEN = re.compile(r"\((?:\?(?:P?<[A-Za-z_][A-Za-z0-9_]*>|[A-Za-z-]*:))?")
_FLAGS = re.compile(r"\(\?[A-Za-z-]*\)")
_WORD_CLASS = re.compile(r"\[(?:[A-Za-z0-9_]|[A-Za-z0-9]-[A-Za-z0-9]|\\[dw])+\]")
_BRACED_ESCAPE = "pPxuUbB"
_CAP = 10**9
"""Widths and spreads stop growing here: enough to be refused."""


@dataclass
class _Level:
    total: int = 0
    last: int = 0
    last_word: bool = False
    repeats: bool = False
    branches: bool = False


def _shape(pattern: str) -> Shape:
    """A pattern's `Shape`, read from its text (Rust's syntax, which reads Python's and
    ECMA-262's without look-around or backreferences). Conservative where unsure:
    a width too large, a repetition counted as nested."""
    levels = [_Level()]
    nested, unbounded, unbounded_words, spread = False, 0, True, 1
    last_group = _Level()  # the group that closed last, if `last` is one
    last_is_group = False
    i, n = 0, len(pattern)
    while i < n:
        c, level = pattern[i], levels[-1]
        if c == "\\":
            j = i + 2
            if i + 1 < n and pattern[i + 1] in _BRACED_ESCAPE and j < n and pattern[j] == "{":
                j = pattern.find("}", j) + 1 or n
            elif i + 1 < n and pattern[i + 1] in "pP":
                j = i + 3
            word = pattern[i + 1 : i + 2] in ("d", "w")
            i = _atom(level, j, word)
            last_is_group = False
            continue
        if c == "[":
            j = _class_end(pattern, i)
            i = _atom(level, j, bool(_WORD_CLASS.fullmatch(pattern, i, j)))
            last_is_group = False
            continue
        if c == "(":
            flags = _FLAGS.match(pattern, i)
            if flags:
                level.last, i = 0, flags.end()
                continue
            opened = _GROUP_OPEN.match(pattern, i)
            levels.append(_Level())
            i = opened.end() if opened else i + 1
            continue
        if c == ")" and len(levels) > 1:
            last_group = levels.pop()
            parent = levels[-1]
            parent.total = min(parent.total + last_group.total, _CAP)
            parent.last, parent.last_word = last_group.total, False
            parent.repeats |= last_group.repeats
            parent.branches |= last_group.branches
            last_is_group = True
            i += 1
            continue
        if c == "|":
            level.branches, level.last = True, 0
            i += 1
            continue
        counted = _COUNTED.match(pattern, i) if c == "{" else None
        last_is_group = last_is_group and (c in "*+?" or counted is not None)
        if c in "^$":
            level.last, i = 0, i + 1
            continue
        if c not in "*+?" and counted is None:
            i = _atom(level, i + 1, c.isalnum() or c == "_")
            continue
        # A repetition of what came last.
        if counted is not None:
            low, comma, high = counted.groups()
            top = int(high) if high else None if comma else int(low)
            i = counted.end()
        else:
            top = 1 if c == "?" else None
            i += 1
        if i < n and pattern[i] in "?+":  # lazy (or possessive, where it is read)
            i += 1
        if last_is_group and (last_group.repeats or last_group.branches):
            nested = True
        if top is None:
            unbounded += 1
            unbounded_words &= level.last_word and not last_is_group
            times = 1
        else:
            low_count = int(counted.group(1)) if counted is not None else 0
            spread = min(spread * (top - low_count + 1), _CAP)
            times = max(top, 1)
        level.total = min(level.total + level.last * (times - 1), _CAP)
        level.last = min(level.last * times, _CAP)
        level.repeats = True
    while len(levels) > 1:  # unclosed: the engine refuses it anyway
        inner = levels.pop()
        levels[-1].total = min(levels[-1].total + inner.total, _CAP)
    return Shape(levels[0].total, nested, unbounded, unbounded_words, spread)


def _atom(level: _Level, end: int, word: bool) -> int:
    level.total = min(level.total + 1, _CAP)
    level.last, level.last_word = 1, word
    return end


def _class_end(pattern: str, start: int) -> int:
    """Where the character class opened at `start` ends (nested classes, escapes, a
    `]` first is a literal)."""
    depth, j, n = 0, start, len(pattern)
    while j < n:
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        first = j == start + 1 or (j == start + 2 and pattern[start + 1] == "^")
        if c == "[":
            depth += 1
        elif c == "]" and not first:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n


def safe_for_backtracking(pattern: str) -> bool:
    """Whether Python's `re` may search a long text for `pattern` without backtracking
    for long: no repetition of something that repeats or has alternatives, at most one
    unbounded repetition, of word characters only (so it stops at a word's end), and
    few ways for a start to match. `^\\d{6}$`, `^(?i:rtn)\\d{3,6}$`, `^[a-z]+-\\d{4}$` are;
    `^(a+)+$`, `(a|aa)+$`, `\\d+\\d+x`, `.*x` are not."""
    shape = _shape(pattern)
    return (
        not shape.nested
        and shape.unbounded <= 1
        and shape.unbounded_words
        and shape.spread * shape.width <= 20_000
    )


@dataclass(frozen=True)
class Regex:
    """A pattern compiled by pydantic-core's Rust `regex` (linear-time matching)."""

    pattern: str
    width: int
    _validator: Any

    def search(self, text: str) -> bool:
        """Whether the pattern matches anywhere in `text` (JSON Schema's `pattern`)."""
        return bool(self._validator.isinstance_python(text))


class RefusedPattern(ValueError):
    """A pattern no linear-time engine here takes; the message says why."""


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> Regex:
    """`pattern` on the linear engine; `RefusedPattern` saying why it cannot be."""
    from pydantic_core import SchemaError, SchemaValidator, core_schema

    shape = _shape(pattern)
    if shape.width > MAX_PATTERN_WIDTH:
        raise RefusedPattern(
            f"it is too wide to match quickly ({_count(shape.width)} atoms with its "
            f"repetitions multiplied out; at most {MAX_PATTERN_WIDTH:,})"
        )
    try:
        made = SchemaValidator(core_schema.str_schema(pattern=pattern, regex_engine="rust-regex"))
    except SchemaError as e:
        said = str(e).strip().splitlines()[-1].strip()
        reason = said.removeprefix("error: ").removeprefix("SchemaError: ").rstrip(".")
        raise RefusedPattern(reason) from None
    return Regex(pattern, max(shape.width, 1), made)


def _count(width: int) -> str:
    return f"over {_CAP:,}" if width >= _CAP else f"{width:,}"


_spent: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "durable_agent_schema_check_spent", default=None
)


def search(pattern: str, text: str) -> bool:
    """JSON Schema's `pattern` match, on the linear engine, within the check's budget."""
    regex = compiled(pattern)
    cost = len(text) * regex.width
    spent = _spent.get()
    if spent is not None:
        spent[0] += cost
        cost = spent[0]
    if cost > CHECK_BUDGET:
        raise _TooCostly
    return regex.search(text)


# -- the validator --------------------------------------------------------------------


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and not search(pattern, instance):
        yield ValidationError(f"{_brief(instance)} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, aP: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """`jsonschema`'s own, with the properties `patternProperties` covers found here."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        k for k in instance if k not in properties and not any(search(p, k) for p in patterns)
    ]
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        shown = ", ".join(_brief(k) for k in sorted(extras)[:20])
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            listed = ", ".join(repr(p) for p in sorted(patterns))
            yield ValidationError(f"{shown} {verb} not match any of the regexes: {listed}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            said = f"Additional properties are not allowed ({shown} {verb} unexpected)"
            yield ValidationError(said)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if unique and validator.is_type(instance, "array"):
        seen: set[Any] = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield ValidationError(f"{_brief(instance)} has non-unique elements")
                return
            seen.add(key)


def _canonical(value: Any) -> Any:
    """A hashable form equal for values JSON Schema calls equal (`1 == 1.0`, objects in
    any key order) and different otherwise (`true` is not `1`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, dict):
        return ("o", frozenset([(k, _canonical(v)) for k, v in value.items()]))
    if isinstance(value, (list, tuple)):
        return ("a", tuple([_canonical(v) for v in value]))
    return ("?", repr(value))


KEYWORDS = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "uniqueItems": _unique_items,
}
"""`jsonschema`'s keywords that match regular expressions or compare items pairwise,
as done here."""


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist = 3, 6, 6
_SHORT.maxstring = _SHORT.maxother = 80


def _brief(value: Any) -> str:
    """A value as an error shows it: a long one shortened before it is written out."""
    return _SHORT.repr(value)


@functools.cache
def _safe_class(base: Any) -> Any:
    from jsonschema import FormatChecker, validators

    # The metaschema's `format: regex` too: a pattern is a regex when the engine that
    # runs it takes it (Python's `re` refuses `\\p{L}`, which the Rust engine reads).
    checker = FormatChecker()
    checker.checkers = {**base.FORMAT_CHECKER.checkers, "regex": (_compiles, RefusedPattern)}
    return validators.extend(base, KEYWORDS, format_checker=checker)


def _compiles(pattern: object) -> bool:
    if isinstance(pattern, str):
        compiled(pattern)  # `RefusedPattern` if not
    return True


class Checker:
    """A schema's validator: `jsonschema`'s, with the keywords of `KEYWORDS`, remote
    `$ref`s refused, and every check within `CHECK_BUDGET`."""

    def __init__(self, schema: Any, validator: Any) -> None:
        self.schema = schema
        self._validator = validator

    def iter_errors(self, value: Any) -> Iterator[Any]:
        """The value's errors (`jsonschema.ValidationError`s), found all at once."""
        from jsonschema import ValidationError
        from referencing.exceptions import Unresolvable

        token = _spent.set([0])
        try:
            found = list(self._validator.iter_errors(value))
        except _TooCostly:
            found = [
                ValidationError(
                    "its strings are too long to check against the schema's patterns "
                    f"(their lengths times the patterns' widths are over {CHECK_BUDGET:,}): "
                    "send shorter ones"
                )
            ]
        except RefusedPattern as e:  # one reached through a `$ref` into a value keyword
            found = [ValidationError(f"the schema has a pattern that cannot be checked: {e}")]
        except Unresolvable as e:
            found = [ValidationError(f"the schema's $ref {str(e.ref)[:200]!r} cannot be resolved")]
        finally:
            _spent.reset(token)
        return iter(found)


def validator(schema: Any) -> Checker:
    """The `Checker` of a JSON schema, made once for each schema (by its JSON);
    `UnusableSchema` saying why it cannot be had."""
    try:
        key = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UnusableSchema(f"its JSON schema is not JSON ({e})") from None
    return _validator(key)


@functools.lru_cache(maxsize=256)
def _validator(key: str) -> Checker:
    from jsonschema import SchemaError, validators
    from referencing import Registry

    schema = json.loads(key)
    refused = _refused_patterns(schema)
    if refused:
        raise UnusableSchema(refused)
    cls = _safe_class(validators.validator_for(schema))
    try:
        cls.check_schema(schema, format_checker=cls.FORMAT_CHECKER)
    except SchemaError as e:
        raise UnusableSchema(f"its JSON schema is not valid: {e.message}") from None
    # An empty registry: a `$ref` resolves within the schema (and the metaschemas),
    # never by fetching a URL.
    return Checker(schema, cls(schema, registry=Registry()))


def _refused_patterns(schema: Any) -> str:
    """Why the schema cannot be checked here, naming the pattern and where it is
    (empty: it can). Walks every subschema, known keyword or not (a `$ref` may point
    anywhere), but not into the instances `VALUE_KEYWORDS` hold."""
    todo: list[tuple[Any, tuple[str, ...]]] = [(schema, ())]
    pattern_properties = unevaluated = False
    while todo:
        node, path = todo.pop()
        if isinstance(node, list):
            todo.extend((v, (*path, str(i))) for i, v in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        patterns = []
        if isinstance(node.get("pattern"), str):
            patterns.append((node["pattern"], path))
        if isinstance(node.get("patternProperties"), dict):
            pattern_properties = True
            patterns.extend((p, (*path, "patternProperties")) for p in node["patternProperties"])
        unevaluated |= "unevaluatedProperties" in node
        for pattern, where in patterns:
            try:
                compiled(pattern)
            except RefusedPattern as e:
                at = f" at {'.'.join(where)}" if where else ""
                return f"its JSON schema's pattern {_brief(pattern)}{at} cannot be used: {e}"
        todo.extend(
            (v, (*path, str(k))) for k, v in reversed(list(node.items())) if k not in VALUE_KEYWORDS
        )
    if pattern_properties and unevaluated:
        return (
            "its JSON schema has both unevaluatedProperties and patternProperties, which "
            "cannot be checked together here: use additionalProperties"
        )
    return ""


# -- pydantic types -------------------------------------------------------------------


def python_re_pattern(core_schema: Any) -> str | None:
    """A string pattern that pydantic would run on Python's backtracking `re` in a type
    (its core schema): one given as a compiled `re.Pattern`, or under
    `regex_engine="python-re"`. None when every pattern runs on Rust's `regex`
    (pydantic's default, which refuses look-around when the type is made)."""
    todo: list[tuple[Any, str]] = [(core_schema, "rust-regex")]
    seen: set[int] = set()
    while todo:
        node, engine = todo.pop()
        if isinstance(node, (list, tuple)):
            todo.extend((v, engine) for v in node)
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        config = node.get("config")
        if isinstance(config, dict):  # a model's (dataclass's, TypedDict's) own, for its fields
            engine = config.get("regex_engine") or "rust-regex"
        if node.get("type") == "str" and node.get("pattern") is not None:
            pattern = node["pattern"]
            own = node.get("regex_engine") or engine
            if isinstance(pattern, re.Pattern) or own == "python-re":
                return pattern.pattern if isinstance(pattern, re.Pattern) else str(pattern)
        todo.extend((v, engine) for k, v in node.items() if k not in ("metadata", "cls", "config"))
    return None


def check_type(core_schema: Any) -> None:
    """`UnusableSchema` when a pydantic type (by its core schema) has a pattern that
    would run on Python's `re`."""
    pattern = python_re_pattern(core_schema)
    if pattern is not None:
        raise UnusableSchema(
            f"its pattern {_brief(pattern)} would run on Python's backtracking `re` (given "
            "as a compiled re.Pattern, or under regex_engine='python-re'), where one value "
            "can stop the worker: give it as a string, on pydantic's default engine"
        )
