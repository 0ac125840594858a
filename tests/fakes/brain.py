"""A brain for the fakes: the offline model, reading a request as a provider gets it.

The fakes translate their wire format to the canonical conversation and hand it
here, so a fake server can take part in whole turns (any question, any number
of rounds) instead of replaying a script.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from durable_agent.conversation import Message, ToolResult
from durable_agent.model import ModelRequest, Reply
from durable_agent.shop import TOOLS
from durable_agent.shop.phrasebook import offline_model
from durable_agent.tools import ToolSpec

Brain = Callable[[list[Message], list[ToolSpec]], Reply]


def offline_brain(messages: list[Message], tools: list[ToolSpec]) -> Reply:
    """Plans on a question, answers from tool results. Tools the shop knows get
    their examples back (providers carry none), as a model's training would."""
    known = {t.name: t for t in TOOLS.specs}
    specs = [
        t.model_copy(update={"examples": known[t.name].examples}) if t.name in known else t
        for t in tools
    ]
    request = ModelRequest(messages=messages, tools=specs)
    model = offline_model()
    step = model.interpret if isinstance(messages[-1], ToolResult) else model.plan
    return asyncio.run(step(request))
