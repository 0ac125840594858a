"""The test kit as a pytest plugin, opted into with `pytest_plugins =
["durable_agent.testing.pytest"]` (in a test module or your top conftest.py).

    async def test_vpn(agent_test):
        async with agent_test(helpdesk.agent, model=TestModel()) as t:
            result = await t.client.ask("Is the VPN down?")

`agent_test` is `durable_agent.testing.agent_test`, on the server the test's marker
names: `@pytest.mark.agent_server("dev")` for what needs the dev server (finding turns,
every turn's pending calls), else the time-skipping test server. Each use starts a
server of its own (a tenth of a second for the test server, a fifth for the dev one,
measured), so tests never share a clock or a turn. Async tests need an async plugin
(pytest-asyncio, with `asyncio_mode = "auto"` or `@pytest.mark.asyncio`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from durable_agent.testing._env import SERVERS, AgentTest
from durable_agent.testing._env import agent_test as _agent_test

MARKER = "agent_server"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(name): the Temporal server the agent_test fixture starts: "
        f"{' or '.join(repr(s) for s in SERVERS)} (default: 'time-skipping')",
    )


@pytest.fixture
def agent_test(
    request: pytest.FixtureRequest,
) -> Callable[..., AbstractAsyncContextManager[AgentTest]]:
    """`durable_agent.testing.agent_test`, on the server the test's marker names."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return _agent_test
    if len(marker.args) != 1 or marker.args[0] not in SERVERS:
        raise pytest.UsageError(
            f"@pytest.mark.{MARKER}{marker.args!r}: give one of {', '.join(SERVERS)}"
        )
    server: Any = marker.args[0]
    return functools.partial(_agent_test, server=server)
