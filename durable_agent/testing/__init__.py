"""A test kit for your own agents: test models, a server and worker in a test, and a replay gate.

    from durable_agent.testing import FunctionModel, TestModel, agent_test

    async with agent_test(agent, model=TestModel()) as t:
        result = await t.client.ask("Is the VPN down?")

    TestModel, FunctionModel   models that answer from the request alone
    typed_reply                a typed turn's value, as a `FunctionModel` returns it
    arguments_for, value_for   values valid for a JSON schema, as `TestModel` makes them
    agent_test, AgentTest      a Temporal server, a worker serving the agent, a client
    record_turn, check_replays recorded turns, replayed on the current code
    ServerLacks, NoConsentAsked, ReplayFailed   what it raises

With `pytest_plugins = ["durable_agent.testing.pytest"]`, the `agent_test` fixture.
docs/testing.md takes you from nothing to a passing test of your agent.
"""

from __future__ import annotations

from durable_agent.conversation import (
    AssistantMessage,
    Message,
    ToolResult,
    UserMessage,
    latest_results,
    question,
)
from durable_agent.model import ModelRequest, Reply
from durable_agent.testing._env import SERVERS, AgentTest, Server, TestClient, agent_test
from durable_agent.testing._errors import NoConsentAsked, ReplayFailed, ServerLacks
from durable_agent.testing._models import FunctionModel, TestModel, typed_reply
from durable_agent.testing._replay import check_replays, record_turn
from durable_agent.testing._values import Arguments, CannotMake, arguments_for, value_for
from durable_agent.types import ToolCall

__all__ = [
    "SERVERS",
    "AgentTest",
    "Arguments",
    "AssistantMessage",
    "CannotMake",
    "FunctionModel",
    "Message",
    "ModelRequest",
    "NoConsentAsked",
    "ReplayFailed",
    "Reply",
    "Server",
    "ServerLacks",
    "TestClient",
    "TestModel",
    "ToolCall",
    "ToolResult",
    "UserMessage",
    "agent_test",
    "arguments_for",
    "check_replays",
    "latest_results",
    "question",
    "record_turn",
    "typed_reply",
    "value_for",
]
