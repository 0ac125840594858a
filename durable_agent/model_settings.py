"""Model settings: how a model is asked (temperature, output limit, stop sequences, ...).

    from durable_agent import Agent, ModelSettings

    agent = Agent(
        name="support",
        model=["openai:gpt-4.1-mini", "anthropic:claude-sonnet-4-6"],
        settings=ModelSettings(temperature=0.2, max_tokens=800),       # every model's
        models={"anthropic": ModelSettings(reasoning_effort="low")},   # a kind's, or a spec's
    )
    await agents.ask("...", settings=ModelSettings(temperature=0))    # this turn's
    client.py ask "..." --set temperature=0 --set stop=END

A turn's model call is sent the settings of its agent, then those its agent gives for
the model's kind (`openai`), then those for the model's spec (`openai:gpt-4.1-mini`),
then the turn's own, each over the one before field by field (`merged`): the more
specific the place, the later its word. `extra` merges key by key.

Each backend maps what its API takes, under the API's own names, and reports the rest
(`unsupported_settings(request)`, by setting, why): the worker logs that once per
backend and setting, the call's step lists them beside the settings it was given, and
the call's span carries what was sent under the GenAI semantic conventions' names
(`gen_ai.request.temperature`, ...). `extra` passes a provider's own parameters
through as the provider names them (OpenAI's `extra_body`, Bedrock's
`additionalModelRequestFields`, Anthropic's body, a SageMaker container's parameters).

Settings travel with the turn (`TurnInput.settings`) and into each model call's
input: they are bounded here, as everything a history holds is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from durable_agent.model import ModelRequest

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""The reasoning efforts providers take (OpenAI's: all of them; Anthropic's `effort`:
low to max; `none` there is no thinking)."""
EFFORTS: tuple[str, ...] = get_args(ReasoningEffort)

MAX_TEMPERATURE = 2.0
"""OpenAI's upper bound; Anthropic and Bedrock take up to 1 (their API says so)."""
MAX_OUTPUT_TOKENS = 1_000_000
MAX_STOP = 4
"""Stop sequences: the most OpenAI's API takes, so a turn's settings work with any backend."""
MAX_STOP_CHARS = 100
MAX_SEED = 2**63 - 1
"""Seeds are 64-bit signed integers (OpenAI's API)."""
MAX_EXTRA_BYTES = 4 * 1024
"""`extra` as compact JSON: it rides in every model call's input of the turn."""
MAX_EXTRA_NAME = 64

RESERVED_EXTRA = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "stream",
        "stream_options",
        "n",
        "thinking",
        "modelId",
        "toolConfig",
        "inferenceConfig",
        "additionalModelRequestFields",
        "inputs",
        "text_inputs",
        "parameters",
    }
)
"""What the backends build themselves from the turn (its conversation, tools, output
type, streaming, one reply, Anthropic's thinking from the model spec): an extra of one
of these names would replace the turn's own, so it is refused."""


class ModelSettings(BaseModel):
    """How a model is asked. Every field is optional: None leaves the provider's default
    (or the setting of an earlier place: `merged`)."""

    model_config = ConfigDict(frozen=True)

    temperature: float | None = None
    """Sampling temperature, from 0 to 2 (Anthropic and Bedrock: to 1)."""
    top_p: float | None = None
    """Nucleus sampling: the probability mass sampled from, from 0 to 1."""
    max_tokens: int | None = None
    """The reply's own output limit in tokens (Anthropic: besides a thinking budget)."""
    stop: list[str] | None = None
    """Up to 4 sequences at which the model stops writing (`--set stop=END`: one)."""
    seed: int | None = None
    """For providers that sample reproducibly with one (OpenAI-compatible, SageMaker)."""
    parallel_tool_calls: bool | None = None
    """False: at most one tool call a reply (OpenAI's `parallel_tool_calls`,
    Anthropic's `disable_parallel_tool_use`)."""
    reasoning_effort: ReasoningEffort | None = None
    """How hard a reasoning model thinks: none, minimal, low, medium, high, xhigh, max."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """A provider's own parameters, as it names them (`{"top_k": 40}`), sent beside the
    others (one of a setting's own name has the last word); at most 4 KB of JSON. A
    later place's extra adds to an earlier one's, key by key; an extra the provider does
    not know is its 400."""

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        unknown = (
            [k for k in data if k not in cls.model_fields] if isinstance(data, Mapping) else []
        )
        if unknown:
            raise ValueError(unknown_setting(str(unknown[0])))
        return data

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature(cls, v: Any) -> Any:
        return _number("temperature", v, 0.0, MAX_TEMPERATURE)

    @field_validator("top_p", mode="before")
    @classmethod
    def _top_p(cls, v: Any) -> Any:
        return _number("top_p", v, 0.0, 1.0)

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens(cls, v: Any) -> Any:
        return _whole("max_tokens", v, 1, MAX_OUTPUT_TOKENS)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed(cls, v: Any) -> Any:
        return _whole("seed", v, -MAX_SEED - 1, MAX_SEED, "a 64-bit whole number")

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if v is None:
            return v
        given = [v] if isinstance(v, str) else v
        if not isinstance(given, (list, tuple)) or not all(isinstance(s, str) for s in given):
            raise ValueError(f"stop: give text, or a list of texts, not {_shown(v)}")
        if len(given) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} sequences, not {len(given)}")
        for s in given:
            if not 1 <= len(s) <= MAX_STOP_CHARS:
                raise ValueError(
                    f"stop: each sequence from 1 to {MAX_STOP_CHARS} characters, not {len(s)}"
                )
        return list(given)

    @field_validator("parallel_tool_calls", mode="before")
    @classmethod
    def _parallel(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, bool):
            raise ValueError(f"parallel_tool_calls: give true or false, not {_shown(v)}")
        return v

    @field_validator("reasoning_effort", mode="before")
    @classmethod
    def _effort(cls, v: Any) -> Any:
        if v is not None and v not in EFFORTS:
            raise ValueError(f"reasoning_effort: give one of {', '.join(EFFORTS)}, not {_shown(v)}")
        return v

    @field_validator("extra", mode="before")
    @classmethod
    def _extra(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(
                f"extra: give a JSON object of the provider's parameters, not {_shown(v)}"
            )
        for name in v:
            if not isinstance(name, str) or not 1 <= len(name) <= MAX_EXTRA_NAME:
                raise ValueError(
                    f"extra: a parameter's name is 1 to {MAX_EXTRA_NAME} characters, "
                    f"not {_shown(name)}"
                )
            if name in RESERVED_EXTRA:
                raise ValueError(
                    f"extra: {name!r} is the backend's own (the turn's conversation, tools, "
                    "output or streaming): give only parameters of the provider's"
                )
        try:
            size = len(json.dumps(v, separators=(",", ":"), allow_nan=False).encode())
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"extra: give JSON values (finite numbers, text, lists, objects): {e}"
            ) from None
        if size > MAX_EXTRA_BYTES:
            raise ValueError(f"extra: at most {MAX_EXTRA_BYTES:,} bytes of JSON, not {size:,}")
        return dict(v)

    def given(self) -> list[str]:
        """The settings this holds (not None; `extra` when it has any), in field order."""
        return [
            name
            for name in type(self).model_fields
            if (value := getattr(self, name)) is not None and value != {}
        ]

    def line(self, limit: int = 300) -> str:
        """`temperature=0.2 stop=["END"]`: what a step shows, as `--set` takes it."""
        parts = [f"{name}={_json(getattr(self, name))}" for name in self.given()]
        text = " ".join(parts)
        return text if len(text) <= limit else text[: limit - 1] + "…"


def merged(*layers: ModelSettings | None) -> ModelSettings | None:
    """The layers, each over the ones before it field by field (a None field leaves the
    earlier value); `extra` key by key. None when no layer gives anything."""
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        for name in layer.given():
            if name == "extra":
                extra.update(layer.extra)
            else:
                values[name] = getattr(layer, name)
    if extra:
        values["extra"] = extra
    return ModelSettings.model_validate(values) if values else None


def from_pairs(pairs: Iterable[str]) -> ModelSettings | None:
    """`--set KEY=VALUE`, each value read as JSON where it parses and as text where it
    does not (`stop=END`, `temperature=0.2`, `extra.top_k=40`, `extra={"top_k": 40}`);
    a later pair of a key wins. ValueError, one line naming the key, otherwise."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, has, raw = pair.partition("=")
        key = key.strip()
        if not has or not key:
            raise ValueError(f"give KEY=VALUE, e.g. temperature=0.2, not {pair!r}")
        value = _value(raw)
        if key in ("stop", "reasoning_effort") and not isinstance(value, (str, list)):
            value = raw  # text settings: `stop=1` stops at "1"
        if key.startswith("extra."):
            values.setdefault("extra", {})[key.removeprefix("extra.")] = value
        elif key == "extra":
            if not isinstance(value, dict):
                raise ValueError(
                    f"extra: give a JSON object, e.g. extra='{{\"top_k\": 40}}', not {raw!r}"
                )
            values.setdefault("extra", {}).update(value)
        elif key in ModelSettings.model_fields:
            values[key] = value
        else:
            raise ValueError(unknown_setting(key))
    try:
        return ModelSettings.model_validate(values) if values else None
    except ValidationError as e:
        raise ValueError(one_line(e)) from None


def one_line(e: ValidationError) -> str:
    """A validation error of settings as one line: what each wrong setting's bounds are."""
    return "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())


def unknown_setting(name: str) -> str:
    return (
        f"no setting {name!r}: the settings are {', '.join(ModelSettings.model_fields)}; "
        f"a provider's own parameter goes in extra (extra={{{name!r}: ...}}, "
        f"--set extra.{name}=...)"
    )


def unsupported(model: Any, request: ModelRequest) -> dict[str, str]:
    """The settings of `request` the backend does not send, and why: what it says
    (`unsupported_settings`), or all of them for a model that says nothing (it declares
    no settings it takes: the offline and scripted models, a model of your own)."""
    settings = request.settings
    if settings is None:
        return {}
    said = getattr(model, "unsupported_settings", None)
    if said is None:
        return {name: "this model takes no settings" for name in settings.given()}
    why = dict(said(request))
    # In the settings' own order, whatever order the backend says them in.
    return {name: why[name] for name in settings.given() if name in why}


_reported: set[tuple[str, str, str]] = set()
"""(provider, model, setting) the worker has logged as ignored: once each per process."""


def first_reports(provider: str, name: str, ignored: Mapping[str, str]) -> dict[str, str]:
    """Of `ignored`, what this process has not said yet of this backend (and remembers
    it now): a worker logs each ignored setting once, not once per call."""
    new = {k: why for k, why in ignored.items() if (provider, name, k) not in _reported}
    _reported.update((provider, name, k) for k in new)
    return new


def ignored_line(provider: str, name: str, ignored: Mapping[str, str]) -> str:
    """One line: which settings a backend ignores, and why."""
    reasons = "; ".join(f"{k}: {why}" for k, why in ignored.items())
    return f"{provider} {name} ignores {', '.join(ignored)} ({reasons})"


def _number(name: str, v: Any, low: float, high: float) -> Any:
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{name}: give a number from {low:g} to {high:g}, not {_shown(v)}")
    if not math.isfinite(v) or not low <= v <= high:
        raise ValueError(f"{name}: give a number from {low:g} to {high:g}, not {v!r}")
    return float(v)


def _whole(name: str, v: Any, low: int, high: int, what: str = "") -> Any:
    if v is None:
        return v
    if isinstance(v, float) and v.is_integer() and math.isfinite(v):
        v = int(v)
    what = what or f"a whole number from {low:,} to {high:,}"
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name}: give {what}, not {_shown(v)}")
    if not low <= v <= high:
        raise ValueError(f"{name}: give {what}, not {_shown(v)}")
    return v


def _value(raw: str) -> Any:
    """A `--set` value: JSON where it parses (numbers, true, lists, objects), else text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:39] + "…"
