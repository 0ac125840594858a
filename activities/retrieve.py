"""retrieve (local activity): seed 004's retrieval step, before a turn's loop.

For an agent whose knowledge asks for it (`Knowledge(..., retrieve=N)`), the workflow
runs it once, before the first model call: every context source of the agent gives its
passages for the question, and the turn puts them in the model's conversation as the
result of a `search_knowledge` call (data with its sources, never instructions). Its
result is recorded in the history (a marker), so a replay reads the passages the turn
got and never searches again. A read only: it may run again if its worker dies before
the result is recorded. What it found is screened by the agent's tool-output shields, as
a search call's result is: instruction-like text in a document stays marked data.

The question's attached documents (and its conversation's) are searched with the
knowledge here (`context_sources.ReadsAttached`): read from the payload store as the
turn's, cut and searched for this one step, never kept in a shared index. An agent
that retrieves with no knowledge (its memory's recall) searches them the same way, by
themselves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from durable_agent.activities.parse_output import screened
from durable_agent.attachments import Attachment
from durable_agent.context_sources import (
    MAX_DOCUMENTS,
    MAX_PASSAGES,
    Passage,
    ReadsAttached,
    in_turn,
    render_passages,
)
from durable_agent.principal import Principal
from durable_agent.runtime import attachments as stored_attachments
from durable_agent.serving import Agents
from durable_agent.shields import Verdict
from durable_agent.types import ToolCall

RETRIEVED_HEADING = "Passages of the knowledge for this question"
RECALLED_HEADING = (
    "Passages for this question (memory passages are what this customer told in earlier "
    "conversations)"
)
MEMORY_PREFIX = "mem_"
MAX_QUERY_CHARS = 500
CALL_ID = "retrieve-1"


class RetrieveInput(BaseModel):
    agent: str = ""
    """The turn's agent (empty: the worker's first)."""
    question: str
    customer_id: str = ""
    """Whom the turn serves (the shields' request names them)."""
    asker: Principal | None = None
    """Whom the turn serves, as recorded (`TurnInput.asker`): a source of someone's own
    (memory) gives only theirs."""
    documents: list[Attachment] = Field(default_factory=list, max_length=MAX_DOCUMENTS)
    """The attached documents (not images) the turn's conversation holds, by reference:
    searched for this turn beside the knowledge (`context_sources.ReadsAttached`)."""


class RetrieveOutput(BaseModel):
    call: ToolCall
    """The search call the step stands for in the conversation (the first source's tool,
    the question as its query), as the model would make it."""
    text: str
    """What the model reads (`context_sources.render_passages`, bounded), after the
    tool-output shields."""
    passages: int = 0
    """How many passages it holds."""
    recalled: int = 0
    """How many of them are the customer's memories (`durable_agent.memory`)."""
    verdicts: list[Verdict] = []
    """The tool-output shields' verdicts on it (none: no shields)."""


class RetrieveActivity:
    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    @activity.defn(name="retrieve")
    async def retrieve(self, input: RetrieveInput) -> RetrieveOutput:
        served = self._agents.get(input.agent)
        given: list[list[Passage]] = []
        asking = [source for source in served.sources if source.retrieve]
        # Read here, as the model activity reads them: the payload store's checks and the
        # turn's lineage say which files this turn may read (and a failure fails the step).
        readers = [s for s in asking if isinstance(s, ReadsAttached)]
        loaded = await stored_attachments.load(input.documents) if input.documents else {}
        documents = [(a, loaded[a.sha256]) for a in input.documents]
        for source in asking:
            own = await source.passages(input.question, source.retrieve, input.asker)
            if isinstance(source, ReadsAttached) and documents:
                attached = await source.attached_passages(
                    documents, input.question, source.retrieve
                )
                own = in_turn(attached, own)[: source.retrieve]
            given.append(own)
        if documents and asking and not readers:
            # No knowledge to search them with (an agent with memory only): the files
            # by themselves, first (the question came with them).
            limit = max(source.retrieve for source in asking)
            given.insert(0, await _attached_only(documents, input.question, limit))
        found = _allotted(given)
        # The call it stands for is a read's (a search, a recall), never a write's.
        tools = [t for source in asking for t in source.tools() if not t.side_effects]
        tool = tools[0] if tools else None
        arguments: dict[str, Any] = {}
        if tool is not None and tool.args_model is not None:
            fields = list(tool.args_model.model_fields)
            arguments = {fields[0]: input.question[:MAX_QUERY_CHARS]} if fields else {}
        call = ToolCall(id=CALL_ID, name=tool.name if tool else "retrieve", arguments=arguments)
        recalled = sum(p.id.startswith(MEMORY_PREFIX) for p in found)
        text = render_passages(found, RECALLED_HEADING if recalled else RETRIEVED_HEADING)
        out = await screened(served, served.tools, call, text, input.customer_id, rendered=True)
        kept = out.observation.text
        for passage in found:
            # Screened as the model will read it; recorded by reference where the text
            # must be deletable (a memory), and read back for each model call.
            if passage.ref:
                by_reference = passage.model_copy(update={"text": passage.ref})
                kept = kept.replace(passage.render(), by_reference.render())
        return RetrieveOutput(
            call=call,
            text=kept,
            passages=len(found),
            recalled=recalled,
            verdicts=out.verdicts,
        )


async def _attached_only(
    documents: list[tuple[Attachment, bytes]], question: str, limit: int
) -> list[Passage]:
    """The turn's files' passages for the question, as knowledge searches them (for that
    one search, in an index of its own), at most `limit`."""
    # Imported only for a turn with files and no knowledge: the knowledge package
    # imports the core, never the other way at load.
    from durable_agent.knowledge import attached_passages

    return await asyncio.to_thread(attached_passages, documents, question, limit)


def _allotted(given: list[list[Passage]]) -> list[Passage]:
    """Each source's passages (best first, as many as its `retrieve`), `MAX_PASSAGES` in
    all, the slots dealt to the sources in turn: knowledge's `retrieve=10` leaves room
    for memory's recall (5 and 5, or 7 and 3 when memory finds 3), and a source that
    finds fewer leaves its slots to the others. The sources' order is kept (knowledge
    first)."""
    taken = [0] * len(given)
    while sum(taken) < MAX_PASSAGES and any(n < len(g) for n, g in zip(taken, given, strict=True)):
        for i, passages in enumerate(given):
            if taken[i] < len(passages) and sum(taken) < MAX_PASSAGES:
                taken[i] += 1
    return [p for passages, n in zip(given, taken, strict=True) for p in passages[:n]]
