"""Typed outputs: a turn that ends with a value of a type, not with prose.

    class Slot(BaseModel):
        slot_id: str
        time: str
        doctor: str

    Agent(name="clinic", ..., output_type=Slot)          # every turn of the agent
    result = await agents.ask("Book me ...", output_type=Slot)   # or one turn's own
    result.output                                        # Slot(slot_id=..., ...)

Any type pydantic's `TypeAdapter` takes will do: a pydantic model, a dataclass, a
TypedDict, a list, a scalar. The type travels as its JSON schema (`OutputSpec`, in
`TurnInput.output`); an agent's own type stays with the agent, on the worker.

How the model gives the value, as its final step (it may call tools first):
- through the output tool `final_result`, whose parameters are the schema (every
  backend; a backend that can force a tool call is told to, `ModelRequest.final_tool`);
- through the provider's native structured output where the backend has it
  (`native_output = True`: OpenAI-compatible `response_format`), with the schema made
  strict-compatible (`strict_schema`). A schema that cannot be strict (a free-form
  dict's `additionalProperties`) goes the output tool's way instead.
A list or a scalar is the `result` property of the object the model gives: tool
parameters and strict schemas are objects.

The client gives a typed turn's value as an object of the type the caller named
(`ask(output_type=...)`, or the agent itself: `ask(agent=clinic)`). For an agent's own
type the turn also records where the type is defined (`OutputSpec.python`, then
`TurnOutput.output_type`: `module:qualname`), and a client whose process has loaded that
module gives the object too (`loaded_type`); it never imports a module a record names.
Otherwise the value is its JSON.

The model-call activity reads the value out of the reply and validates it (`read`):
with the type itself for an agent's own type, with the JSON schema for a turn's. A
valid value is the reply's `output` (JSON text), and the turn ends with it; an invalid
one is its `output_error`, which goes back to the model (`repair`) at most
`TurnLimits.max_replans` times before the turn ends `invalid_output`.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import re
import sys
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError

from durable_agent import schemas
from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage
from durable_agent.tools import ToolSpec
from durable_agent.types import OutputSpec, ToolCall, compact_json

OUTPUT_TOOL = "final_result"
"""The output tool's name (as in Pydantic AI): an agent's tools may not use it."""
WRAPPER = "result"
"""The property that holds a value whose schema is not an object (a list, a scalar)."""
NOT_RUN = (
    f"not run: {OUTPUT_TOOL} was called in the same reply. Call the tools you need "
    f"first; call {OUTPUT_TOOL} alone, once you have their results."
)
Mode = Literal["tool", "native"]


def output_spec(output_type: Any) -> OutputSpec:
    """The JSON schema of a type, as a turn carries it (an `OutputSpec` as it is);
    `TypeError` naming the type when pydantic cannot describe it, or when its values
    could not be checked in linear time (a pattern with look-around or backreferences,
    or one pydantic would run on Python's `re`: `durable_agent.schemas`)."""
    if isinstance(output_type, OutputSpec):
        _checked_schema(output_type)
        return output_type
    try:
        adapter = TypeAdapter(output_type)
        schema = adapter.json_schema()
    except Exception as e:  # PydanticSchemaGenerationError, PydanticInvalidForJsonSchema
        raise TypeError(
            f"output_type {output_type!r}: pydantic cannot describe it as JSON schema ({e}); "
            "give a pydantic model, a dataclass, a TypedDict, a list or a scalar type"
        ) from None
    title = schema.get("title") or getattr(output_type, "__name__", "") or "output"
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", str(title)).strip("_")[:64] or "output"
    spec = OutputSpec(name=name, json_schema=schema)
    try:  # an agent's type checks its values itself, a turn's by its JSON schema
        schemas.check_type(adapter.core_schema)
    except schemas.UnusableSchema as e:
        raise TypeError(f"output type {name!r}: {e}") from None
    _checked_schema(spec)
    return spec


MAX_TYPE_PATH = 300
"""The longest `module:qualname` a turn records of its type (longer: none)."""


def type_path(output_type: Any) -> str:
    """Where a class is defined, as `module:qualname`, for a client that has that module
    loaded (`loaded_type`); empty for what no other process could find by it: no class
    (a list, a scalar), a class made inside a function, one of a script run as
    `__main__` (another process's `__main__` is another script), a name too long."""
    if not isinstance(output_type, type):
        return ""
    module, qualname = output_type.__module__, output_type.__qualname__
    if module in ("__main__", "builtins") or "<" in qualname:
        return ""
    path = f"{module}:{qualname}"
    return path if len(path) <= MAX_TYPE_PATH else ""


def loaded_type(path: str) -> type | None:
    """The class `path` (`type_path`'s) names, if this process has loaded its module and
    it is a pydantic model, a dataclass or an enum; else None. The module is never
    imported here: a name read from a turn's record is no code to run, and a process
    that has not loaded the module does not use the type."""
    module_name, _, qualname = path.partition(":")
    found: Any = sys.modules.get(module_name) if qualname else None
    for part in qualname.split(".") if found is not None else ():
        # What is there, not `getattr`: a module's `__getattr__` may import on demand.
        found = getattr(found, "__dict__", {}).get(part)
    if not isinstance(found, type):
        return None
    if issubclass(found, (BaseModel, enum.Enum)) or dataclasses.is_dataclass(found):
        return found
    return None


def _checked_schema(spec: OutputSpec) -> Any:
    """The validator of a turn's output type; `TypeError` naming the type and why its
    schema cannot be checked."""
    try:
        return schemas.validator(spec.json_schema)
    except schemas.UnusableSchema as e:
        raise TypeError(f"output type {spec.name!r}: {e}") from None


class Output:
    """A turn's output type, as the worker checks it: its spec, and how values are
    validated (by the type itself when the worker has it, else by its JSON schema)."""

    def __init__(
        self, spec: OutputSpec, adapter: TypeAdapter[Any] | None = None, checker: Any = None
    ) -> None:
        self.spec = spec
        self._adapter = adapter
        self._checker = checker

    @classmethod
    def of_type(cls, output_type: Any) -> Output:
        """An agent's own type: its spec says where it is defined too (`type_path`)."""
        spec = output_spec(output_type).model_copy(update={"python": type_path(output_type)})
        return cls(spec, TypeAdapter(output_type))

    @classmethod
    def of_spec(cls, spec: OutputSpec) -> Output:
        """A turn's own type, checked by its JSON schema: `TypeError` when it cannot be."""
        return cls(spec, checker=_checked_schema(spec))

    @property
    def wrapped(self) -> bool:
        return self.spec.wrapped

    def tool(self) -> ToolSpec:
        """The output tool: its parameters are the schema."""
        return ToolSpec(
            name=OUTPUT_TOOL,
            description=(
                f"Give your final answer as a {self.spec.name}, and end your turn. Call it "
                "last and alone, once the other tools' results are in."
            ),
            parameters=parameters(self.spec),
        )

    def validate(self, value: Any) -> str:
        """The value as JSON text, validated; `InvalidOutput` naming each problem."""
        if self._adapter is not None:
            try:
                valid = self._adapter.validate_python(value)
            except ValidationError as e:
                raise InvalidOutput(_pydantic_problems(e)) from None
            return compact_json(self._adapter.dump_python(valid, mode="json"))
        checker = self._checker or _checked_schema(self.spec)
        problems = sorted(checker.iter_errors(value), key=lambda e: list(e.path))
        if problems:
            raise InvalidOutput("; ".join(f"{_path(e.path)}: {e.message}" for e in problems[:10]))
        return compact_json(value)


class InvalidOutput(ValueError):
    """A value that does not fit the turn's output type; the message says why."""


def parameters(spec: OutputSpec) -> dict[str, Any]:
    """The object schema the model fills: the type's own, or (a list, a scalar) an
    object whose `result` is one; definitions stay at the root."""
    schema = copy.deepcopy(spec.json_schema)
    if not spec.wrapped:
        return schema
    defs = schema.pop("$defs", None)
    wrapper: dict[str, Any] = {
        "type": "object",
        "properties": {WRAPPER: schema},
        "required": [WRAPPER],
    }
    if defs:
        wrapper["$defs"] = defs
    return wrapper


def strict_schema(spec: OutputSpec) -> dict[str, Any] | None:
    """The parameters as a strict structured-output schema (OpenAI's rules): every
    object closed (`additionalProperties: false`) with every property required, no
    `default`, a `$ref` with siblings inlined. None when the schema cannot be strict
    (an object open to any property: a dict)."""
    root = parameters(spec)
    defs = root.get("$defs", {})
    try:
        return _strict(root, defs, depth=0)
    except _NotStrict:
        return None


class _NotStrict(Exception):
    pass


def _strict(node: Any, defs: dict[str, Any], depth: int) -> Any:
    if depth > 64:
        raise _NotStrict
    if isinstance(node, list):
        return [_strict(n, defs, depth + 1) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node and len(node) > 1:
        # OpenAI refuses a `$ref` with sibling keywords: inline what it names.
        name = str(node["$ref"]).rsplit("/", 1)[-1]
        if name not in defs:
            raise _NotStrict
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        return _strict(merged, defs, depth + 1)
    out = {
        k: _strict(v, defs, depth + 1)
        for k, v in node.items()
        if k != "default" and k not in ("properties", "$defs")
    }
    if "$defs" in node:
        out["$defs"] = {k: _strict(v, defs, depth + 1) for k, v in node["$defs"].items()}
    if node.get("type") == "object" or "properties" in node:
        if node.get("additionalProperties", False) is not False or "patternProperties" in node:
            raise _NotStrict
        properties = node.get("properties", {})
        out["properties"] = {k: _strict(v, defs, depth + 1) for k, v in properties.items()}
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


def mode(native: bool, output: Output) -> Mode:
    """How the model is asked for the value: natively when its backend can and the
    schema can be strict, else through the output tool."""
    return "native" if native and strict_schema(output.spec) is not None else "tool"


def read(reply_text: str, calls: list[ToolCall], output: Output, how: Mode) -> ReadOutput:
    """The value the reply gives, validated; or why it gives none that fits. A reply
    that calls other tools (and not the output tool) gives nothing yet."""
    final = [c for c in calls if c.name == OUTPUT_TOOL]
    if final:
        call = final[0]
        if call.error:
            return ReadOutput(error=f"the arguments of {OUTPUT_TOOL} are {call.error}")
        return _checked(output, call.arguments)
    if calls:
        return ReadOutput()
    if how == "tool":
        return ReadOutput(
            error=f"a reply in words is not accepted here: call {OUTPUT_TOOL} with the answer"
        )
    try:
        value = json.loads(reply_text)
    except json.JSONDecodeError as e:
        return ReadOutput(error=f"the reply is not valid JSON ({e.msg}): reply with JSON only")
    return _checked(output, value)


class ReadOutput(BaseModel):
    value: str | None = None
    """The valid value, as JSON text."""
    error: str = ""


def _checked(output: Output, given: Any) -> ReadOutput:
    if output.wrapped:
        if not isinstance(given, dict) or WRAPPER not in given:
            return ReadOutput(error=f"give the value as the {WRAPPER!r} property of an object")
        given = given[WRAPPER]
    try:
        return ReadOutput(value=output.validate(given))
    except InvalidOutput as e:
        return ReadOutput(error=str(e))


def repair(said: AssistantMessage, error: str) -> list[Message]:
    """What goes back to the model after a value that does not fit: its message (as it
    wrote it, with what only its provider reads), then the errors (as the output tool's
    result, or in a message of their own)."""
    fix = f"The value does not fit the output schema: {error}. Fix it and give it again."
    if not said.calls:
        return [said, UserMessage(text=fix)]
    results: list[Message] = [
        ToolResult(
            call_id=c.id, tool=c.name, ok=False, text=fix if c.name == OUTPUT_TOOL else NOT_RUN
        )
        for c in said.calls
    ]
    return [said, *results]


def _path(path: Any) -> str:
    return ".".join(str(p) for p in path) or "value"


def _pydantic_problems(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}"
        + (f" (got {err['input']!r})" if err["type"] != "missing" else "")
        for err in e.errors()[:10]
    )
