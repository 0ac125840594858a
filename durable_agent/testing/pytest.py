"""The test kit as a pytest plugin, opted into with `pytest_plugins =
["durable_agent.testing.pytest"]` (in a test module, or in your top conftest.py).

    async def test_vpn(agent_test):
        async with agent_test(helpdesk.agent, model=TestModel()) as t:
            result = await t.client.ask("Is the VPN down?")

The `agent_test` fixture is `durable_agent.testing.agent_test`, with what the worker
keeps on disk (MCP tool lists, a local payload store: `AGENT_STATE_DIR`) in the test's
own temporary folder rather than in the folder the tests run from. Each use starts a
server of its own (measured: a tenth of a second for the time-skipping test server, a
fifth for the dev server), so tests never share a clock or a turn. Async tests need an
async plugin: pytest-asyncio, with `asyncio_mode = "auto"` or `@pytest.mark.asyncio`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from durable_agent.testing._env import AgentTest
from durable_agent.testing._env import agent_test as _agent_test

STATE_DIR = "AGENT_STATE_DIR"


@pytest.fixture
def agent_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., AbstractAsyncContextManager[AgentTest]]:
    """`durable_agent.testing.agent_test`, keeping the worker's files in the test's folder."""
    monkeypatch.setenv(STATE_DIR, str(tmp_path / "agent-state"))
    return _agent_test
