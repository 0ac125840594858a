"""An MCP server whose tools ask the client's model for a message
(`sampling/createMessage`), written with the official `mcp` SDK (stdio).

    python tests/fakes/sampling_server.py [LOG]

`summarise` asks for a summary of `text` (a system prompt, one user message, at most
`max_tokens` tokens); `describe` asks about an image. Each answers what it got
(`sampled MODEL: TEXT`, or `error MESSAGE`), and appends the same line to LOG if
given: every time the server's tool ran.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ImageContent, SamplingMessage, TextContent, ToolAnnotations

LOG = sys.argv[1] if len(sys.argv) > 1 else ""

server = MCPServer("sampling")
READ = ToolAnnotations(read_only_hint=True)  # no consent to the call: the test is of sampling


def _said(line: str) -> str:
    if LOG:
        with open(LOG, "a") as f:
            f.write(line + "\n")
    return line


async def _sample(ctx: Context, content: TextContent | ImageContent, max_tokens: int) -> str:
    try:
        got = await ctx.session.create_message(
            [SamplingMessage(role="user", content=content)],
            max_tokens=max_tokens,
            system_prompt="Summarise in one line.",
        )
    except Exception as e:  # noqa: BLE001 - the client refused, or has not asked yet
        return _said(f"error {' '.join(str(e).split())[:160]}")
    text = got.content.text if isinstance(got.content, TextContent) else "?"
    return _said(f"sampled {got.model}: {text}")


@server.tool(annotations=READ, description="Summarise a text (with the client's model).")
async def summarise(text: str, ctx: Context, max_tokens: int = 200) -> str:
    return await _sample(ctx, TextContent(type="text", text=f"Summarise: {text}"), max_tokens)


@server.tool(annotations=READ, description="Describe a picture (with the client's model).")
async def describe(ctx: Context) -> str:
    image = ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png")
    return await _sample(ctx, image, 100)


if __name__ == "__main__":
    server.run()
