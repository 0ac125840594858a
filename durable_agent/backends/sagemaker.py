"""SageMaker endpoints serving text-completion models (no native tool calling).

    --model sagemaker:<endpoint-name>
    AGENT_SAGEMAKER_PAYLOAD=tgi (default) | text2text

For models like Flan-UL2 that only complete text: `plan` prompts with the tool
list and few-shot examples (the tools' own), then reads the completion
tolerantly: every known tool name it mentions is a call; arguments written as
`name(key="value")` or `name(value)` are used, and missing ones are filled
from the question with the argument schemas' patterns. "no_tool" (or no known
tool) is a direct answer. `interpret` prompts with the tool results: the
completion is the final answer, unless it names a tool, which is read as
tolerantly as plan's and becomes the next call (a call already made is not
repeated).

Payload formats: `tgi` (TGI / LMI / most JumpStart LLM containers):
`{"inputs": ..., "parameters": {...}}` → `[{"generated_text": ...}]`;
`text2text` (JumpStart Flan-T5/UL2): `{"text_inputs": ..., "max_length": ...}`
→ `{"generated_texts": [...]}`. Token usage is estimated from word counts.

Model settings (`ModelRequest.settings`) go into the payload as the containers name
them: the output limit (`max_new_tokens`, `max_length`; over each prompt's own), a
temperature above 0 or a top_p under 1 with `do_sample`, a seed, TGI's stop sequences,
and a container's own parameters (`extra`). A completion has no parallel calls or
reasoning effort: those are ignored, and said so (`unsupported_settings`).

A task of N rounds of tools costs N + 1 completions, as with the chat backends.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from durable_agent.answers import decline_text
from durable_agent.argfill import fill_arguments, required_params
from durable_agent.backends import _aws
from durable_agent.conversation import AssistantMessage, ToolResult, UserMessage
from durable_agent.errors import InvalidModelOutput, ModelCannotAnswer, ModelRequestRejected
from durable_agent.model import ModelRequest, Reply
from durable_agent.model_settings import ModelSettings
from durable_agent.stream import TextSink
from durable_agent.tools import ToolSpec
from durable_agent.types import ToolCall, Usage

PLAN_TEMPLATE = """Your task is to select appropriate tools to satisfy the user input. If no tool is required, then pick "no_tool"

Tools available are:

{tools}
no_tool: No tool is needed to answer the user input.

You can suggest multiple tools, separated by a comma.

Examples:
{examples}
user: "What are your business hours on the moon?"
tool: no_tool

user input: {question}
tool:"""

INTERPRET_TEMPLATE = """Answer the customer's question using only the tool results below. If another tool is needed first, reply with its name instead ({tools}). If nothing answers it, reply: {decline}

Tool results:
{results}

Question: {question}
Answer:"""


NO_PARAMETER = ("parallel_tool_calls", "reasoning_effort")


class SageMakerTextModel:
    provider = "aws.sagemaker"

    def __init__(self, endpoint: str, client: Any = None, payload: str | None = None) -> None:
        if not endpoint:
            raise ModelRequestRejected("name the endpoint: --model sagemaker:<endpoint-name>")
        self.name = endpoint
        self.payload = payload or os.environ.get("AGENT_SAGEMAKER_PAYLOAD", "tgi")
        if self.payload not in ("tgi", "text2text"):
            raise ModelRequestRejected(
                f"AGENT_SAGEMAKER_PAYLOAD={self.payload!r}: use tgi or text2text"
            )
        self._client = client or _aws.client("sagemaker-runtime", "sagemaker")

    def unsupported_settings(self, request: ModelRequest) -> dict[str, str]:
        """A completion has no tool calls to run in parallel, nor a reasoning effort; the
        text2text payload has no stop sequences."""
        settings = request.settings
        if settings is None:
            return {}
        ignored = {name: "a text completion has no such parameter" for name in NO_PARAMETER}
        if self.payload == "text2text":
            ignored["stop"] = "the text2text payload has no stop sequences"
        return {k: why for k, why in ignored.items() if k in settings.given()}

    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        _text_only(request)
        prompt = plan_prompt(request)
        text = await self._complete(prompt, max_new_tokens=60, settings=request.settings)
        calls = parse_tools(text, request.tools, request.question)
        usage = _usage(prompt, text)
        if calls:
            return Reply(calls=calls, usage=usage)
        return Reply(text=decline_text(request.instructions), usage=usage)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        _text_only(request)
        prompt = interpret_prompt(request)
        text = (await self._complete(prompt, max_new_tokens=200, settings=request.settings)).strip()
        usage = _usage(prompt, text)
        made = {
            _key(c) for m in request.messages if isinstance(m, AssistantMessage) for c in m.calls
        }
        calls = [
            c for c in parse_tools(text, request.tools, request.question) if _key(c) not in made
        ]
        if calls:
            return Reply(calls=calls, usage=usage)
        return Reply(text=text or decline_text(request.instructions), usage=usage)

    async def _complete(
        self, prompt: str, max_new_tokens: int, settings: ModelSettings | None = None
    ) -> str:
        given = settings or ModelSettings()
        limit = given.max_tokens or max_new_tokens
        if self.payload == "tgi":
            parameters: dict[str, Any] = {"max_new_tokens": limit, "do_sample": False}
            if given.stop:
                parameters["stop"] = list(given.stop)
            parameters.update(_sampling(given))
            body: dict[str, Any] = {"inputs": prompt, "parameters": parameters}
        else:
            body = {"text_inputs": prompt, "max_length": limit, **_sampling(given)}
        try:
            resp = await asyncio.to_thread(
                self._client.invoke_endpoint,
                EndpointName=self.name,
                ContentType="application/json",
                Accept="application/json",
                Body=json.dumps(body),
            )
        except Exception as e:
            raise _aws.classify(e, "SageMaker", "endpoint name") from e
        return generated_text(resp["Body"].read())


def _sampling(settings: ModelSettings) -> dict[str, Any]:
    """Sampling parameters as the containers take them: a temperature above 0 or a
    top_p under 1 samples (`do_sample`; TGI refuses a temperature of 0 and a top_p of 1,
    which are what greedy decoding is), a seed makes it repeatable; the container's
    own parameters (`extra`) last."""
    sampled: dict[str, Any] = {}
    if settings.temperature:
        sampled["temperature"] = settings.temperature
    if settings.top_p is not None and 0 < settings.top_p < 1:
        sampled["top_p"] = settings.top_p
    if sampled:
        sampled["do_sample"] = True
    if settings.seed is not None:
        sampled["seed"] = settings.seed
    return {**sampled, **settings.extra}


def plan_prompt(request: ModelRequest) -> str:
    tools = "\n".join(f"{t.name}: {' '.join(t.description.split())}" for t in request.tools)
    examples = "\n".join(
        f'user: "{example}"\ntool: {t.name}\n' for t in request.tools for example in t.examples
    )
    return PLAN_TEMPLATE.format(tools=tools, examples=examples, question=request.question)


def _text_only(request: ModelRequest) -> None:
    """Its prompts are text: a question's files are refused, never silently dropped (a
    fallback model may take them)."""
    if any(isinstance(m, UserMessage) and m.attachments for m in request.messages):
        raise ModelCannotAnswer(
            "a SageMaker endpoint takes text only, and this question has attachments: "
            "ask a model that takes files (openai:, anthropic:, bedrock:) or the offline one"
        )


def interpret_prompt(request: ModelRequest) -> str:
    """The results of this turn's calls (since the customer last spoke), each after its call."""
    calls: dict[str, ToolCall] = {}
    results: list[str] = []
    for m in request.messages:
        if isinstance(m, UserMessage):
            calls.clear()
            results.clear()
        elif isinstance(m, AssistantMessage):
            calls.update((c.id, c) for c in m.calls)
        elif isinstance(m, ToolResult):
            call = calls.get(m.call_id)
            results.append(f"- {call.render() if call else m.tool}: {m.text}")
    return INTERPRET_TEMPLATE.format(
        tools=", ".join(t.name for t in request.tools),
        decline=decline_text(request.instructions),
        results="\n".join(results) or "(none)",
        question=request.question,
    )


def parse_tools(text: str, tools: list[ToolSpec], question: str) -> list[ToolCall]:
    """Every known tool the completion names, in order, with its arguments."""
    by_name = {t.name: t for t in tools}
    names = "|".join(re.escape(n) for n in sorted(by_name, key=len, reverse=True))
    if not names:
        return []
    calls = []
    for i, m in enumerate(re.finditer(rf"\b({names})\b(?:\s*\(([^)]*)\))?", text), 1):
        spec = by_name[m.group(1)]
        params = required_params(spec)
        args = _written_arguments(m.group(2) or "", [p.name for p in params])
        found = fill_arguments(params, question) or {}
        calls.append(ToolCall(id=f"call_{i}", name=spec.name, arguments={**found, **args}))
    return calls


def _written_arguments(inside: str, param_names: list[str]) -> dict[str, str]:
    """`key="v", k2=v2` or a lone positional `v` (for the first parameter)."""
    pairs = re.findall(r"(\w+)\s*=\s*[\"']?([^,\"')]+)[\"']?", inside)
    if pairs:
        return {k: v.strip() for k, v in pairs}
    value = inside.strip().strip("\"'")
    return {param_names[0]: value} if value and param_names else {}


def generated_text(raw: bytes) -> str:
    """The completion from the common container response shapes."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return raw.decode("utf-8", "replace")
    if isinstance(data, list) and data:
        data = data[0]
    if isinstance(data, dict):
        for key in ("generated_text", "generated_texts", "outputs", "output"):
            value = data.get(key)
            if isinstance(value, list) and value:
                value = value[0]
            if isinstance(value, str):
                return value
    raise InvalidModelOutput(f"unrecognised SageMaker response: {str(data)[:200]}")


def _key(call: ToolCall) -> tuple[str, str]:
    return call.name, repr(sorted(call.arguments.items()))


def _usage(prompt: str, reply: str) -> Usage:
    return Usage(model_calls=1, input_tokens=len(prompt.split()), output_tokens=len(reply.split()))
