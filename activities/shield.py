"""shield (local activity): run the worker's shields of one position on some texts.

Shields only read, and most answer in milliseconds (the offline one) or a short
HTTP call (Bedrock Guardrails, Llama Guard), so this is a local activity: its
result is one marker in the history, with no extra round trip to the server.
Transient trouble is retried by the activity's policy; on the last attempt a
shield that still cannot judge gives a verdict instead: a violation (fail
closed), or, with `AGENT_SHIELDS_FAIL_OPEN=1`, an allowance.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from durable_agent import attachments, redact
from durable_agent.activities._conversation import Conversations
from durable_agent.attachments import Attachment
from durable_agent.errors import AttachmentRefused, AttachmentUnreadable
from durable_agent.runtime import attachments as stored_attachments
from durable_agent.serving import Agents, ServedAgent
from durable_agent.shields import ShieldConfigError, ShieldRequest, ShieldSet, Verdict
from durable_agent.transcript import ConversationRef, context_of
from durable_agent.types import AgentInfo


class ShieldInput(BaseModel):
    requests: list[ShieldRequest]
    agent: str = ""
    """The turn's agent (empty: the worker's first)."""
    conversation: ConversationRef | None = None
    """The requests' context is this conversation's (`context_of`): the input names it
    rather than carrying it (an answer's screen of a long turn)."""


class ShieldOutput(BaseModel):
    verdicts: list[list[Verdict]]
    """Per request, one verdict per shield of its position (none: no shields there)."""
    refusal: str = ""
    """What the turn answers if it ends for a refusal here: the agent's own words."""
    agent: AgentInfo | None = None
    """Who answers the turn, told by the screen of its question: the turn's first step
    resolves its agent, at no extra cost (an unknown agent fails it: `UnknownAgent`)."""


class ShieldActivity:
    def __init__(self, agents: Agents, conversations: Conversations | None = None) -> None:
        self._agents = agents
        self._conversations = conversations or Conversations()

    @activity.defn(name="shield")
    async def shield(self, input: ShieldInput) -> ShieldOutput:
        served = self._agents.get(input.agent)
        position = input.requests[0].position if input.requests else "input"
        info = None
        if position == "input":
            if served.live:
                await served.refresh_tools()  # between turns: this is a turn's first step
            info = _info(served)
            if served.live:
                # The turn records its lists by hash: kept for the workers that did not
                # list them (once per list and worker), from the version `info` names.
                await served.keep_lists()
        requests = input.requests
        if input.conversation is not None and served.shields.at(position):
            context = context_of(await self._conversations.of(input.conversation))
            # And what the turn adds (instructions evaluated for it).
            requests = [r.model_copy(update={"context": [*context, *r.context]}) for r in requests]
        verdicts = await screen(served, requests)
        for request, judged in zip(requests, verdicts, strict=True):
            if request.attachments:
                judged += await screen_attachments(served, request.attachments)
        refused = any(not v.allowed for vs in verdicts for v in vs)
        return ShieldOutput(
            verdicts=verdicts,
            refusal=_refusal(served, position) if refused else "",
            agent=info,
        )


async def screen(served: ServedAgent, requests: list[ShieldRequest]) -> list[list[Verdict]]:
    """Per request, the verdicts of the agent's shields of its position."""
    return [await judge(served.shields, _drawing_on_instructions(r, served)) for r in requests]


ATTACHMENTS = "attachments"
"""The verdicts on a question's files: the agent's limits, always checked."""


async def screen_attachments(served: ServedAgent, files: list[Attachment]) -> list[Verdict]:
    """A question's files: their count, types and sizes within the agent's limits (one
    verdict), then the text of each document screened by the input shields, as the
    question is. Their bytes are read from the payload store here, never carried."""
    try:
        served.agent.attachments.check(files)
    except AttachmentRefused as e:
        return [Verdict(shield=ATTACHMENTS, allowed=False, category="attachment", message=str(e))]
    verdicts = [Verdict(shield=ATTACHMENTS)]
    if not served.shields.at("input"):
        return verdicts
    documents = [a for a in files if not a.is_image]
    data = await stored_attachments.load(documents)
    for a in documents:
        try:
            text = attachments.text_of(a, data[a.sha256])
        except AttachmentUnreadable as e:
            verdicts.append(
                Verdict(shield=ATTACHMENTS, allowed=False, category="attachment", message=str(e))
            )
            continue
        if text.strip():
            judged = await judge(served.shields, ShieldRequest(position="input", text=text))
            verdicts += [v.model_copy(update={"message": _in(a, v.message)}) for v in judged]
    return verdicts


def _in(a: Attachment, message: str) -> str:
    return f"in {a.name}: {message}" if message else message


def _drawing_on_instructions(request: ShieldRequest, served: ServedAgent) -> ShieldRequest:
    """A call or an answer may also draw on the agent's own instructions (the address
    they tell customers to write to, say): added last to what it may draw on."""
    if not request.context or request.position not in ("tool_input", "output"):
        return request
    return request.model_copy(update={"context": [*request.context, served.instructions]})


def _refusal(served: ServedAgent, position: str) -> str:
    if position == "input":
        return served.question_refusal
    if position == "output":
        return served.refusals.answer
    return ""


def _info(served: ServedAgent) -> AgentInfo:
    return AgentInfo(
        name=served.name,
        fingerprint=served.fingerprint,
        limits=served.limits,
        unknown_outcomes=served.unknown_outcomes,
        model_calls=served.model_calls,
        tools_version=served.fingerprint if served.live else "",
        tool_lists=served.list_hashes() if served.live else {},
        output=served.output.spec if served.output else None,
        models=served.model_specs if len(served.model_specs) > 1 else [],
        dynamic_instructions=served.dynamic is not None,
        retrieve=served.retrieve,
    )


async def judge(shields: ShieldSet, request: ShieldRequest) -> list[Verdict]:
    """Every shield of the request's position, in order."""
    verdicts = []
    for shield in shields.at(request.position):
        try:
            verdicts.append(await shield.check(request))
        except ShieldConfigError as e:
            verdicts.append(_cannot_judge(shield.name, str(e), shields.fail_open))
        except Exception as e:
            if not _last_attempt():
                raise  # transient: the activity's retry policy tries again
            verdicts.append(_cannot_judge(shield.name, str(e), shields.fail_open))
    return verdicts


def _last_attempt() -> bool:
    info = activity.info()
    limit = info.retry_policy.maximum_attempts if info.retry_policy else 0
    return 0 < limit <= info.attempt


def _cannot_judge(name: str, why: str, fail_open: bool) -> Verdict:
    """The verdict is a step's text, and the model's to read: it says that the shield
    could not judge; why (its service's error, which may name an account or repeat what
    it was sent) is the operator's, in the worker's log."""
    then = "allowed (AGENT_SHIELDS_FAIL_OPEN)" if fail_open else "refused (shields fail closed)"
    activity.logger.warning("shield %s could not judge: %s; %s", name, redact.mask(why), then)
    return Verdict(
        shield=name,
        allowed=fail_open,
        category="shield_unavailable",
        message=f"{name} could not judge; {then}",
    )
