"""An MCP server whose tools ask the person for input (`elicitation/create`), written
with the official `mcp` SDK (stdio).

    python tests/fakes/eliciting_server.py [LOG]

`signup` asks, in form mode, for an email, a plan (an enum), a seat count and whether
to send news (required, with a default); `verify` asks, in URL mode, that a page be
visited. Each answers what it got (`accept {...}`, `decline`, `cancel`, or the error
its question met), and appends the same line to LOG if given: every time the server's tool ran.
`slow` takes `seconds` to answer (it logs `slow started` first).
"""

from __future__ import annotations

import json
import sys
from typing import Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

LOG = sys.argv[1] if len(sys.argv) > 1 else ""

server = MCPServer("eliciting")
READ = ToolAnnotations(read_only_hint=True)  # no consent asked: the test is of questions


class Signup(BaseModel):
    # `news` is required with a default: a person may leave it out, and the client
    # fills it in (MCP's SEP-1034) before the answer is checked.
    model_config = ConfigDict(json_schema_extra={"required": ["email", "plan", "seats", "news"]})

    email: str = Field(description="Where the receipt goes", max_length=100)
    plan: Literal["basic", "pro"] = Field(description="Which plan")
    seats: int = Field(ge=1, le=50, description="How many seats")
    news: bool = Field(default=False, description="Send the newsletter")


def _said(line: str) -> str:
    if LOG:
        with open(LOG, "a") as f:
            f.write(line + "\n")
    return line


@server.tool(
    annotations=READ, description="Sign the customer up for a plan (asks the person for details)."
)
async def signup(customer: str, ctx: Context) -> str:
    try:
        got = await ctx.elicit(f"Sign {customer} up: which plan, and where to?", Signup)
    except Exception as e:  # noqa: BLE001 - the client said it cannot answer now
        return _said(f"error {' '.join(str(e).split())[:120]}")
    if got.action == "accept":
        return _said(f"accept {json.dumps(got.data.model_dump(), sort_keys=True)}")
    return _said(got.action)


@server.tool(
    annotations=READ,
    description="Verify the customer's identity (asks the person to visit a page).",
)
async def verify(customer: str, ctx: Context) -> str:
    try:
        got = await ctx.elicit_url(
            f"Verify {customer} at our page", f"https://id.example.com/v/{customer}", "v-1"
        )
    except Exception as e:  # noqa: BLE001
        return _said(f"error {' '.join(str(e).split())[:120]}")
    return _said(got.action)


@server.tool(annotations=READ, description="Answer after a while.")
async def slow(seconds: float) -> str:
    import anyio

    _said("slow started")
    await anyio.sleep(seconds)
    return _said("slow done")


if __name__ == "__main__":
    server.run()
