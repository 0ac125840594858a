"""An MCP server that misbehaves as told, written with the official `mcp` SDK (stdio).

    python tests/fakes/mcp_server.py SPEC.json

SPEC says what its `tools/list` answers, first, and after its `change` tool is called
(`"then"`, a SPEC of its own: the server then says its list changed, as a server
whose tools were upgraded does):

    tools         the tools listed, as the protocol writes them (name, inputSchema,
                  annotations); every server also lists `change`, a read
    pages         "forever": every page of the list names a next one (a cursor that
                  never ends), each page `tools` again under new names
    list_delay    seconds each `tools/list` takes
    list_error    `tools/list` answers this error
    noise         lines of junk written to stdout (not JSON-RPC) as the server starts
                  (the SDK's stdio transport moves print()'s stdout to stderr: these
                  go to the protocol's pipe, as an older or careless server's do)
    call_noise    as many after each call
    structured    {tool: value}: a call of that tool answers `value` as its structured
                  content too (a tool listed with an `outputSchema` must)
    then          the SPEC from the `change` call on

A call of a listed tool answers `<tool> got <arguments as JSON>`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR

CHANGE = types.Tool(
    name="change",
    description="Switch to the next tool list.",
    input_schema={"type": "object", "properties": {}},
    annotations=types.ToolAnnotations(read_only_hint=True),
)


def main() -> None:
    state: dict[str, Any] = json.loads(Path(sys.argv[1]).read_text())
    wire = os.dup(1)  # the protocol's pipe, before the transport claims it

    def junk(lines: int) -> None:
        for n in range(lines):  # one write a line: atomic on a pipe
            os.write(wire, f"debug: not a protocol message {n}\n".encode())

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> Any:
        spec = state
        if spec.get("list_delay"):
            await anyio.sleep(spec["list_delay"])
        if spec.get("list_error"):
            raise MCPError(INTERNAL_ERROR, spec["list_error"])
        tools = [types.Tool.model_validate(t) for t in spec.get("tools", [])]
        if spec.get("pages") == "forever":
            page = int(params.cursor) if params and params.cursor else 0
            renamed = [t.model_copy(update={"name": f"{t.name}_{page}"}) for t in tools]
            return types.ListToolsResult(tools=renamed, next_cursor=str(page + 1))
        return types.ListToolsResult(tools=[CHANGE, *tools])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        nonlocal state
        if params.name == "change":
            state = state.get("then", state)
            await ctx.session.send_tool_list_changed()
            text = "changed"
        else:
            text = f"{params.name} got {json.dumps(params.arguments or {}, sort_keys=True)}"
        junk(state.get("call_noise", 0))
        content = [types.TextContent(type="text", text=text)]
        structured = state.get("structured", {})
        if params.name in structured:
            return types.CallToolResult(content=content, structured_content=structured[params.name])
        return types.CallToolResult(content=content)

    server = Server("misbehaving", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run() -> None:
        async with stdio_server() as (read, write):
            junk(state.get("noise", 0))
            await server.run(read, write, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
