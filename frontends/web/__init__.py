"""The web chat: one page where a customer talks to the agent and watches it work.

    python client.py web [--port 8080] [--customer ID] [--host 127.0.0.1]

    serve(conn, chat, host=, port=, task_queue=)   run it until Ctrl-C (`server.py`)
    frontends.web.app.create_app(conn, chat, ...)  the ASGI app alone, for any ASGI server

Steps show as the turn records them (a memory it recalled in its words, for the
turn's own customer, as `show` prints it), the answer types itself out, a call that
needs consent gets Approve and Reject buttons, a message's files show under it (read
back for its customer only: `app.attachment`), a support lead gets a queue of the
tenant's calls waiting for them, and each turn links to its history in the Temporal
Web UI. A page reads its conversation from the stream's start, so
a reload (or a second tab) shows the same conversation and goes on live. The page
is plain HTML, CSS and JavaScript served from `static/`: no build step, nothing
fetched from elsewhere. Without a JWT login (`auth.py`), it is bound to loopback
unless told otherwise; behind a gateway, AGENT_WEB_HOSTS names the host names it
serves (`app.py`). Each
client's new conversations and messages are rate-limited (`limits.py`).

Starlette and uvicorn come with the `web` extra; they are imported only when the
chat is served, and their absence is a one-line `AgentClientError` saying so.
"""

from __future__ import annotations

from durable_agent.agents import Agent
from durable_agent.chat import ConversationInput
from durable_agent.errors import AgentClientError
from durable_agent.runtime.server import Connection
from durable_agent.runtime.settings import TASK_QUEUE

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


async def serve(
    conn: Connection,
    chat: ConversationInput | None = None,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    task_queue: str = TASK_QUEUE,
    agent: Agent | None = None,
) -> None:
    """Serve the chat on `host:port` (port 0: any free one) until Ctrl-C, SIGTERM or
    cancellation. Every page starts conversations like `chat` (customer, agent, model,
    limits) and speaks in the words of the agent that answers them (its title,
    description and examples): `agent`'s, else those the task queue's current worker
    version published, else its name alone. Prints the URL once it listens; a port in
    use is an `AgentClientError`."""
    _needs_extra()
    from durable_agent.frontends.web.server import serve as run

    await run(conn, chat, host=host, port=port, task_queue=task_queue, agent=agent)


def _needs_extra() -> None:
    """Starlette and uvicorn are there, or the person is told how to get them."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise AgentClientError(
            f"the web chat needs the `web` extra ({e.name} is not installed): "
            "pip install -e '.[web]'"
        ) from None
