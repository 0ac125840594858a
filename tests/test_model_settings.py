"""Model settings (`durable_agent.model_settings`) on a real server and worker: a turn's
settings over its agent's, its model kind's and spec's, field by field; each backend's
strict fake gets them under its API's own names (Chat Completions, the Messages API,
Converse); what a backend does not send is said once per backend and setting in the
worker's log and in every step it concerns; `--set` on the command line and bad
settings in one line, before anything reaches the server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber
from openai import AsyncOpenAI
from pydantic import ValidationError
from temporalio.testing import WorkflowEnvironment

from durable_agent import Agent, AgentClient, ModelSettings
from durable_agent.backends.bedrock import BedrockConverseModel
from durable_agent.backends.openai_chat import OpenAIChatModel
from durable_agent.backends.sagemaker import SageMakerTextModel
from durable_agent.commands.client import main
from durable_agent.conversation import UserMessage
from durable_agent.errors import AgentClientError, InvalidSettings
from durable_agent.model import ModelRequest, Reply
from durable_agent.model_settings import from_pairs, merged
from durable_agent.scripted import ScriptedModel
from durable_agent.tools import ToolRegistry
from durable_agent.types import Outcome, Step, StepKind, ToolCall, TurnLimits, TurnOutput
from tests.conftest import Capture, Harness, stubbed_aws_client
from tests.fakes import anthropic_messages as messages_api
from tests.fakes import chat_completions as chat_api
from tests.fakes import converse as converse_api
from tests.fakes.anthropic_messages import MessagesServer
from tests.fakes.chat_completions import ChatCompletionsServer, running
from tests.test_compaction import Reader, read_doc
from tests.test_examples import code_blocks
from tests.test_sagemaker_backend import completion, expect

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Has order 123456 shipped?"
ORDER = ToolCall(id="c1", name="order_status", arguments={"order_id": "123456"})


@pytest.fixture
def chat() -> Iterator[ChatCompletionsServer]:
    yield from running()


@pytest.fixture
def messages() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.close()


def shop(harness: Harness, **fields: Any) -> Agent:
    """The demo shop's agent, on the test's model (`scripted`), with these fields."""
    return replace(harness.agent(), model="scripted", **fields)


async def ask(harness: Harness, model: Any, agent: Agent, **options: Any) -> TurnOutput:
    async with harness.worker(model, agents=[agent]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        return await client.ask(QUESTION, **options)


def replies(result: TurnOutput) -> list[Step]:
    """The steps that record a model's reply: the calls it made, then its answer."""
    kinds = (StepKind.PLAN, StepKind.CONTINUE, StepKind.ANSWER)
    return [s for s in result.steps if s.kind in kinds]


def order_then_answer(name: str = "scripted") -> ScriptedModel:
    return ScriptedModel(
        plans=[Reply(calls=[ORDER])], decisions=[Reply(text="It shipped.")], name=name
    )


# --- the settings themselves --------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"temperature": 2.5}, "temperature: give a number from 0 to 2, not 2.5"),
        ({"temperature": float("nan")}, "temperature: give a number from 0 to 2, not nan"),
        ({"temperature": "hot"}, "temperature: give a number from 0 to 2, not 'hot'"),
        ({"temperature": True}, "temperature: give a number from 0 to 2, not True"),
        ({"top_p": -0.1}, "top_p: give a number from 0 to 1, not -0.1"),
        ({"max_tokens": 0}, "max_tokens: give a whole number from 1 to 1,000,000, not 0"),
        ({"max_tokens": 2.5}, "max_tokens: give a whole number from 1 to 1,000,000, not 2.5"),
        ({"seed": 2**64}, "seed: give a 64-bit whole number, not 18446744073709551616"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop: at most 4 sequences, not 5"),
        ({"stop": ["x" * 101]}, "stop: each sequence from 1 to 100 characters, not 101"),
        ({"stop": [""]}, "stop: each sequence from 1 to 100 characters, not 0"),
        ({"stop": [1]}, "stop: give text, or a list of texts, not [1]"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls: give true or false, not 'yes'"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort: give one of none, minimal, low"),
        ({"extra": {"top_k": "x" * 5000}}, "extra: at most 4,096 bytes of JSON, not 5,012"),
        ({"extra": {"messages": []}}, "extra: 'messages' is the backend's own"),
        ({"extra": {"x": float("inf")}}, "extra: give JSON values"),
        ({"extra": [1]}, "extra: give a JSON object of the provider's parameters, not [1]"),
        ({"top_k": 40}, "no setting 'top_k': the settings are temperature, top_p, max_tokens"),
    ],
)
async def test_a_setting_out_of_its_bounds_is_one_line_at_the_client(
    env: WorkflowEnvironment, given: dict[str, Any], said: str
) -> None:
    client = AgentClient(env.client, task_queue="nobody-serves-this")
    with pytest.raises(InvalidSettings) as raised:
        await client.start("Hi", settings=given)
    assert str(raised.value).startswith(said)
    assert "\n" not in str(raised.value)
    with pytest.raises(InvalidSettings):
        client.chat(settings=given)
    with pytest.raises(ValidationError):
        ModelSettings.model_validate(given)
    assert issubclass(InvalidSettings, AgentClientError)


def test_an_agents_settings_are_checked_as_it_is_defined() -> None:
    with pytest.raises(ValueError, match=r"^agent 'a': settings: no setting 'temprature'"):
        Agent(name="a", settings={"temprature": 0.2})
    with pytest.raises(ValueError, match=r"^agent 'a': models\['openai'\]: stop: at most 4"):
        Agent(name="a", models={"openai": {"stop": ["x"] * 5}})
    with pytest.raises(ValueError, match=r"models\['openai'\] must be a ModelSettings"):
        Agent(name="a", models={"openai": "fast"})
    # Given as a dict of its fields (as Pydantic AI's are), kept typed.
    agent = Agent(name="a", settings={"temperature": 0.2}, models={"openai": {"seed": 1}})
    assert agent.settings == ModelSettings(temperature=0.2)
    assert agent.models["openai"] == ModelSettings(seed=1)
    assert agent.model_factories == {}


def test_each_place_is_over_the_one_before_it_field_by_field() -> None:
    """agent < the model's kind < the model's spec < the turn; `extra` key by key."""
    agent = Agent(
        name="a",
        settings=ModelSettings(temperature=0.5, max_tokens=100, stop=["END"], extra={"a": 1}),
        models={
            "openai": ModelSettings(temperature=0.7, seed=1, extra={"b": 2}),
            "openai:gpt-4o": ModelSettings(seed=2, extra={"a": 3}),
            "offline": lambda _: None,  # a factory beside them, as before
        },
    )
    assert agent.settings_for("openai:gpt-4o") == ModelSettings(
        temperature=0.7, max_tokens=100, stop=["END"], seed=2, extra={"a": 3, "b": 2}
    )
    assert agent.settings_for("openai:gpt-4o-mini") == ModelSettings(
        temperature=0.7, max_tokens=100, stop=["END"], seed=1, extra={"a": 1, "b": 2}
    )
    assert agent.settings_for("bedrock:nova") == agent.settings
    turn = ModelSettings(temperature=0.0, extra={"b": 9})
    assert merged(agent.settings_for("openai:gpt-4o"), turn) == ModelSettings(
        temperature=0.0, max_tokens=100, stop=["END"], seed=2, extra={"a": 3, "b": 9}
    )
    assert merged(None, ModelSettings(), None) is None  # nothing given: no settings at all
    assert list(agent.model_factories) == ["offline"]


def test_set_reads_json_where_it_parses_and_text_where_it_does_not() -> None:
    assert from_pairs(
        [
            "temperature=0.2",
            "stop=END",
            "max_tokens=300",
            "parallel_tool_calls=false",
            "reasoning_effort=low",
            "seed=7",
            "extra.top_k=40",
            'extra={"min_p": 0.1}',
            "temperature=0.3",  # a later pair of a key wins
        ]
    ) == ModelSettings(
        temperature=0.3,
        stop=["END"],
        max_tokens=300,
        parallel_tool_calls=False,
        reasoning_effort="low",
        seed=7,
        extra={"top_k": 40, "min_p": 0.1},
    )
    assert from_pairs(['stop=["END", "STOP"]', "extra.user=u-1"]) == ModelSettings(
        stop=["END", "STOP"], extra={"user": "u-1"}
    )
    assert from_pairs(["stop=1"]) == ModelSettings(stop=["1"])  # text settings stay text
    assert from_pairs([]) is None


@pytest.mark.parametrize(
    ("pairs", "said"),
    [
        (["top_k=40"], "--set: no setting 'top_k': the settings are temperature"),
        (["temperature=hot"], "--set: temperature: give a number from 0 to 2, not 'hot'"),
        (["temperature=3"], "--set: temperature: give a number from 0 to 2, not 3"),
        (["temperature"], "--set: give KEY=VALUE, e.g. temperature=0.2, not 'temperature'"),
        (['stop=["a","b","c","d","e"]'], "--set: stop: at most 4 sequences, not 5"),
        (["extra=[1]"], "--set: extra: give a JSON object"),
        (["extra.messages=[]"], "--set: extra: 'messages' is the backend's own"),
    ],
)
def test_the_cli_refuses_a_bad_setting_in_one_line(
    pairs: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [arg for pair in pairs for arg in ("--set", pair)]
    # No server is reached: the turn is refused as it is built.
    code = main(["--task-queue", "nobody-serves-this", "ask", "Hi", *flags])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"error: {said}")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# --- through turns --------------------------------------------------------------------


async def test_a_turns_settings_are_over_its_agents_and_its_steps_hold_them(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"scripted-{uuid.uuid4().hex[:6]}"
    model = order_then_answer(name)
    agent = shop(
        harness,
        settings=ModelSettings(temperature=0.7, max_tokens=300, extra={"a": 1}),
        models={"scripted": ModelSettings(seed=3, extra={"b": 2})},
    )
    result = await ask(
        harness, model, agent, settings=ModelSettings(temperature=0.1, extra={"a": 9})
    )

    assert result.outcome is Outcome.ANSWERED
    given = ModelSettings(temperature=0.1, max_tokens=300, seed=3, extra={"a": 9, "b": 2})
    assert [r.settings for _, r in model.requests] == [given, given]
    plan, answer = replies(result)
    assert (plan.kind, answer.kind) == (StepKind.PLAN, StepKind.ANSWER)
    for step in (plan, answer):
        assert step.settings == given
        # A model that declares no settings it takes sends none of them, and says so.
        assert step.settings_ignored == ["temperature", "max_tokens", "seed", "extra"]
    assert plan.render().endswith(
        '  (settings: temperature=0.1 max_tokens=300 seed=3 extra={"a":9,"b":2}; '
        "ignored: temperature, max_tokens, seed, extra)"
    )
    # Said once per backend and setting, not once per call (two calls here).
    said = [r.getMessage() for r in caplog.records if f"scripted {name} ignores" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"scripted {name} ignores temperature, max_tokens, seed, extra (")
    assert "this model takes no settings" in said[0]

    # A second turn on the same worker's backend: not said again, still in its steps.
    caplog.clear()
    again = order_then_answer(name)
    second = await ask(harness, again, agent, settings=ModelSettings(temperature=0.1))
    assert [s.settings_ignored for s in replies(second)] == [plan.settings_ignored] * 2
    assert f"scripted {name} ignores" not in caplog.text


async def test_a_turn_without_settings_records_none(harness: Harness) -> None:
    result = await ask(harness, order_then_answer(), shop(harness))
    assert result.outcome is Outcome.ANSWERED
    assert all(s.settings is None and not s.settings_ignored for s in result.steps)
    assert all("settings:" not in s.render() for s in result.steps)


async def test_a_chats_turns_all_get_its_settings(harness: Harness) -> None:
    model = ScriptedModel(plans=[Reply(text="Hello.")])
    async with harness.worker(model, agents=[shop(harness)]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        conversation = client.chat(settings={"temperature": 0.4, "stop": "END"})
        first = await conversation.send("Hi")
        second = await conversation.send("Hi again")
        await conversation.end()

    given = ModelSettings(temperature=0.4, stop=["END"])
    assert [r.settings for _, r in model.requests] == [given, given]
    assert replies(first)[-1].settings == replies(second)[-1].settings == given


async def test_set_on_the_command_line_reaches_the_model_and_its_steps(
    harness: Harness, env: WorkflowEnvironment
) -> None:
    model = order_then_answer()
    async with harness.worker(model, agents=[shop(harness)]) as task_queue:
        environ = {
            **os.environ,
            "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
        }
        done = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "client.py",
                "--task-queue",
                task_queue,
                "ask",
                "--follow",
                QUESTION,
                "--set",
                "temperature=0.2",
                "--set",
                "stop=END",
                "--set",
                "extra.top_k=40",
            ],
            cwd=ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert done.returncode == 0, done.stderr
    given = ModelSettings(temperature=0.2, stop=["END"], extra={"top_k": 40})
    assert [r.settings for _, r in model.requests] == [given, given]
    line = '(settings: temperature=0.2 stop=["END"] extra={"top_k":40}; ignored:'
    assert sum(line in out for out in done.stdout.splitlines()) == 2  # plan and answer


# --- each backend, as its API names them -----------------------------------------------


async def test_openai_compatible_servers_get_each_setting_by_its_name(
    harness: Harness, chat: ChatCompletionsServer
) -> None:
    chat.replies = [
        chat_api.tool_calls(("call_a", "order_status", '{"order_id": "123456"}')),
        chat_api.text("It shipped."),
    ]
    agent = shop(
        harness,
        settings=ModelSettings(
            temperature=0.7,
            top_p=0.9,
            max_tokens=256,
            stop=["END"],
            seed=7,
            parallel_tool_calls=False,
            extra={"presence_penalty": 0.5, "user": "u-1"},
        ),
    )
    result = await ask(harness, chat.model(), agent, settings={"temperature": 0.2})

    assert result.outcome is Outcome.ANSWERED
    assert len(chat.accepted) == 2
    for body in chat.accepted:
        assert body["temperature"] == 0.2 and body["top_p"] == 0.9
        # Not OpenAI's own API: the output limit under the name every server takes.
        assert body["max_tokens"] == 256 and "max_completion_tokens" not in body
        assert body["stop"] == ["END"] and body["seed"] == 7
        assert body["parallel_tool_calls"] is False
        assert body["presence_penalty"] == 0.5 and body["user"] == "u-1"  # extra_body
        assert "reasoning_effort" not in body and "extra_body" not in body
    assert all(s.settings_ignored == [] for s in replies(result))


async def test_a_reasoning_model_gets_its_effort_and_max_completion_tokens(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    server = ChatCompletionsServer(reasoning_models=("o-test",))
    try:
        server.replies = [chat_api.text("Hello.")]
        model = server.model("o-test", max_tokens_param="max_completion_tokens")
        settings = {"max_tokens": 500, "reasoning_effort": "low"}
        result = await ask(harness, model, shop(harness), settings=settings)
        assert result.outcome is Outcome.ANSWERED
        (body,) = server.accepted
        assert body["max_completion_tokens"] == 500 and body["reasoning_effort"] == "low"
        assert "max_tokens" not in body

        # The same settings under `max_tokens`, as to a server that is not OpenAI's: a
        # reasoning model refuses them, and the turn says the request was rejected.
        rejected = await ask(harness, server.model("o-test"), shop(harness), settings=settings)
        assert rejected.outcome is Outcome.MODEL_ERROR
        assert server.requests[-1].status == 400 and server.requests[-1].body["max_tokens"] == 500
        assert "'max_tokens' is not supported with this model" in caplog.text
    finally:
        server.close()


def test_the_output_limits_name_follows_the_server() -> None:
    request = ModelRequest(messages=[UserMessage(text="Hi")], settings=ModelSettings(max_tokens=5))
    for base_url, name in [
        (None, "max_completion_tokens"),  # OpenAI's own API
        ("https://acme.openai.azure.com/openai/v1", "max_completion_tokens"),
        ("http://127.0.0.1:8000/v1", "max_tokens"),  # vLLM, Ollama, llama.cpp, ...
    ]:
        client = AsyncOpenAI(api_key="k", base_url=base_url)
        body = OpenAIChatModel("gpt-5", client=client).request(request)
        assert body[name] == 5 and len({"max_tokens", "max_completion_tokens"} & set(body)) == 1


async def test_no_parallel_tool_calls_switch_without_tools(chat: ChatCompletionsServer) -> None:
    """The API refuses `parallel_tool_calls` in a request without tools (a summary's):
    the backend leaves it out there."""
    chat.replies = [chat_api.text("A summary.")]
    settings = ModelSettings(parallel_tool_calls=False, temperature=0.3)
    reply = await chat.model().plan(
        ModelRequest(messages=[UserMessage(text="Summarise.")], settings=settings)
    )
    assert reply.text == "A summary."
    (body,) = chat.accepted
    assert "parallel_tool_calls" not in body and body["temperature"] == 0.3
    # What the fake refuses, as the API does.
    assert chat_api.violation({**body, "parallel_tool_calls": False}) == (
        "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed "
        "when 'tools' are specified."
    )


async def test_an_extra_the_server_does_not_know_is_its_400(
    harness: Harness, chat: ChatCompletionsServer, caplog: pytest.LogCaptureFixture
) -> None:
    result = await ask(harness, chat.model(), shop(harness), settings={"extra": {"top_k": 40}})

    assert result.outcome is Outcome.MODEL_ERROR
    assert len(chat.requests) == 1 and not chat.accepted  # refused, not retried
    assert "Unrecognized request argument supplied: top_k" in caplog.text  # the operator's
    assert "top_k" not in result.answer


async def test_the_messages_api_gets_each_setting_by_its_name(
    harness: Harness, messages: MessagesServer
) -> None:
    messages.replies = [
        messages_api.tool_use(("toolu_a", "order_status", {"order_id": "123456"})),
        messages_api.text("It shipped."),
    ]
    settings = ModelSettings(
        temperature=0.3,
        top_p=0.9,
        max_tokens=1000,
        stop=["END"],
        seed=5,
        parallel_tool_calls=False,
        reasoning_effort="high",
        extra={"top_k": 20},
    )
    result = await ask(harness, messages.model(), shop(harness, settings=settings))

    assert result.outcome is Outcome.ANSWERED
    assert len(messages.accepted) == 2
    for body in messages.accepted:
        assert body["temperature"] == 0.3 and body["top_p"] == 0.9 and body["top_k"] == 20
        assert body["max_tokens"] == 1000 and body["stop_sequences"] == ["END"]
        assert body["output_config"] == {"effort": "high"}
        assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
        assert "seed" not in body
    assert [s.settings_ignored for s in replies(result)] == [["seed"], ["seed"]]


async def test_while_the_model_thinks_no_temperature_is_sent_and_its_steps_say_so(
    harness: Harness, messages: MessagesServer
) -> None:
    messages.replies = [messages_api.text("Hello.")]
    settings = ModelSettings(temperature=0.3, top_p=0.5, max_tokens=800)
    result = await ask(harness, messages.model(thinking=2048), shop(harness, settings=settings))

    assert result.outcome is Outcome.ANSWERED
    (body,) = messages.accepted
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 800 + 2048  # the reply's own limit beside the budget
    assert "temperature" not in body and "top_p" not in body
    (answer,) = replies(result)
    assert answer.settings_ignored == ["temperature", "top_p"]
    # What the API refuses, and so the fake does.
    thinking = {**body, "temperature": 0.3}
    assert messages_api.violation(thinking).startswith(
        "`temperature` may only be set to 1 when thinking is enabled"
    )
    assert messages_api.violation({**body, "top_p": 0.5}).startswith("`top_p` must be greater")

    # A turn whose reasoning effort is `none` does not think: its temperature is sent.
    messages.replies = [messages_api.text("Hello.")]
    settings = {"temperature": 0.3, "reasoning_effort": "none"}
    plain = await ask(harness, messages.model(thinking=2048), shop(harness), settings=settings)
    body = messages.accepted[-1]
    assert "thinking" not in body and body["temperature"] == 0.3
    assert "output_config" not in body
    assert replies(plain)[-1].settings_ignored == []


def test_the_messages_api_fake_refuses_what_the_api_refuses() -> None:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    assert messages_api.violation(body) is None
    assert messages_api.violation({**body, "seed": 1}) == "seed: Extra inputs are not permitted"
    assert messages_api.violation({**body, "temperature": 1.5}) == (
        "temperature: Input should be less than or equal to 1"
    )
    assert messages_api.violation({**body, "stop_sequences": [" "]}) == (
        "stop_sequences: each stop sequence must contain non-whitespace"
    )
    assert messages_api.violation({**body, "output_config": {"effort": "minimal"}}).startswith(
        "output_config.effort: Input should be 'low'"
    )


async def test_converse_gets_inference_config_and_the_models_own_fields(harness: Harness) -> None:
    fake = converse_api.ConverseFake(
        [converse_api.tool_use(("order_status", {"order_id": "123456"})), converse_api.said("Yes.")]
    )
    model = BedrockConverseModel("anthropic.claude-3-5-haiku-20241022-v1:0", client=fake)
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=300,
        stop=["END"],
        seed=1,
        parallel_tool_calls=False,
        extra={"top_k": 50},
    )
    result = await ask(harness, model, shop(harness), settings=settings)

    assert result.outcome is Outcome.ANSWERED
    assert len(fake.accepted) == 2
    for params in fake.accepted:
        assert params["inferenceConfig"] == {
            "maxTokens": 300,
            "temperature": 0.2,
            "topP": 0.9,
            "stopSequences": ["END"],
        }
        assert params["additionalModelRequestFields"] == {"top_k": 50}
    ignored = ["seed", "parallel_tool_calls"]
    assert [s.settings_ignored for s in replies(result)] == [ignored, ignored]
    # What Converse refuses: a temperature over 1 (botocore checks only the least).
    too_hot = {**fake.accepted[0], "inferenceConfig": {"temperature": 1.5}}
    assert converse_api.violation(too_hot) == (
        "The value at inferenceConfig.temperature must be less than or equal to 1."
    )


class SummaryReader(Reader):
    """The long-turn reader of `tests/test_compaction.py`, keeping what each summary
    request was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.summary_requests: list[ModelRequest] = []

    async def summarise(self, request: ModelRequest, stream: object = None) -> Reply:
        self.summary_requests.append(request)
        return await super().summarise(request, stream)


async def test_a_summary_is_asked_with_the_turns_settings(harness: Harness) -> None:
    """Compaction's summary is a call of the turn's model like the others."""
    model = SummaryReader(30, 10_000, write_at=0)
    agent = Agent(
        name="reader",
        tools=ToolRegistry([read_doc]),
        model="scripted",
        settings=ModelSettings(max_tokens=700),
    )
    async with harness.worker(model, agents=[agent]) as task_queue:
        client = AgentClient(harness.client, task_queue=task_queue)
        result = await client.ask(
            "Read", agent="reader", limits=TurnLimits(max_steps=40), settings={"seed": 4}
        )

    assert result.outcome is Outcome.ANSWERED and result.answer == "end-of-doc-30"
    given = ModelSettings(max_tokens=700, seed=4)
    assert model.summary_requests
    assert all(r.settings == given for r in [*model.requests, *model.summary_requests])


async def test_a_sagemaker_container_gets_its_own_parameters(harness: Harness) -> None:
    """TGI's `parameters` (sampling turned on by a temperature, a seed, stop sequences,
    the container's own extras); text2text's body, without stop sequences."""
    client = stubbed_aws_client("sagemaker-runtime")
    settings = ModelSettings(
        temperature=0.4,
        top_p=0.9,
        max_tokens=120,
        stop=["END"],
        seed=11,
        reasoning_effort="low",
        extra={"repetition_penalty": 1.1},
    )
    for payload in ("tgi", "text2text"):
        plan, interpret = Capture(), Capture()
        with Stubber(client) as stubber:
            stubber.add_response("invoke_endpoint", completion("order_status"), expect(plan))
            stubber.add_response("invoke_endpoint", completion("It shipped."), expect(interpret))
            model = SageMakerTextModel("flan-ul2", client=client, payload=payload)
            result = await ask(harness, model, shop(harness), settings=settings)
        assert result.outcome is Outcome.ANSWERED
        for seen in (plan.seen, interpret.seen):
            body = json.loads(seen[0])
            if payload == "tgi":
                assert body["parameters"] == {
                    "max_new_tokens": 120,
                    "do_sample": True,
                    "temperature": 0.4,
                    "top_p": 0.9,
                    "seed": 11,
                    "stop": ["END"],
                    "repetition_penalty": 1.1,
                }
            else:
                assert body == {
                    "text_inputs": body["text_inputs"],
                    "max_length": 120,
                    "temperature": 0.4,
                    "top_p": 0.9,
                    "do_sample": True,
                    "seed": 11,
                    "repetition_penalty": 1.1,
                }
        ignored = ["reasoning_effort"] if payload == "tgi" else ["stop", "reasoning_effort"]
        assert [s.settings_ignored for s in replies(result)] == [ignored, ignored]


def test_the_docs_example_gives_each_model_what_it_says() -> None:
    page = (ROOT / "docs" / "models.md").read_text()
    block = code_blocks(page.split("### Model settings", 1)[1], "python")[0]
    namespace: dict[str, Any] = {}
    exec(block.split("\nawait ", 1)[0], namespace)  # the definition, without the turn
    agent = namespace["agent"]
    assert agent.settings_for("anthropic:claude-sonnet-4-6") == ModelSettings(
        temperature=0.2, max_tokens=800, reasoning_effort="low"
    )
    assert agent.settings_for("openai:gpt-4.1-mini") == ModelSettings(
        temperature=0.2, max_tokens=800, seed=7
    )
