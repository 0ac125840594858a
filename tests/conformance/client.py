"""The project's MCP client (`durable_agent.mcp`) as the client that
`@modelcontextprotocol/conformance` tests:

    conformance client --command "python tests/conformance/client.py" --scenario NAME

The suite starts the scenario's server, then runs this with the server's URL as the
last argument and the scenario's name in `MCP_CONFORMANCE_SCENARIO`; the server checks
what the client did (tests/test_mcp_conformance.py reads its verdict). Each scenario
goes through `Connection`, the worker's own client: initialize and list on `open()`,
then the call the scenario's server waits for. A question the server asks is answered
while the call waits (`ask`) by a person who accepts the form as shown, changing no
field: what reaches the server is the client's own doing (the form's defaults).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

from durable_agent.elicitation import Answer, Question
from durable_agent.mcp import Connection, MCPServer, render

Scenario = Callable[[Connection], Awaitable[str]]


async def listed(connection: Connection) -> str:
    return f"listed: {[tool.name for tool in connection.listed]}"


async def adds(connection: Connection) -> str:
    result = await connection.call("add_numbers", {"a": 5, "b": 7}, write=False)
    return render(result)


async def accepts_the_form_as_shown(question: Question) -> Answer:
    return Answer(digest=question.digest, action="accept", content={}, by="conformance")


async def elicits(connection: Connection) -> str:
    name = "test_client_elicitation_defaults"
    return render(await connection.call(name, {}, write=False, ask=accepts_the_form_as_shown))


async def reconnects(connection: Connection) -> str:
    # The server ends the call's stream early: its answer comes on the stream the
    # client opens again, after the `retry` the server asked for.
    return render(await connection.call("test_reconnection", {}, write=False))


SCENARIOS: dict[str, Scenario] = {
    "initialize": listed,
    "tools_call": adds,
    "elicitation-sep1034-client-defaults": elicits,
    "sse-retry": reconnects,
}


async def main(url: str, scenario: str) -> None:
    run = SCENARIOS[scenario]
    connection = Connection(MCPServer(name="conformance", url=url, sampling="deny"))
    try:
        await connection.open()
        print(await run(connection))
    finally:
        await connection.close()


if __name__ == "__main__":
    name = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    if len(sys.argv) != 2 or name not in SCENARIOS:
        sys.exit(f"usage: MCP_CONFORMANCE_SCENARIO={'|'.join(SCENARIOS)} {sys.argv[0]} URL")
    asyncio.run(main(sys.argv[1], name))
