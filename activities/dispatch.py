"""dispatch: run one tool call. The workflow starts one per call, concurrently.

Runs with the tool's own timeout and retry policy. A `ToolError` (e.g.
`NotFound`) is permanent and reaches the workflow as a non-retryable failure
typed by class name; the workflow shows its message to the model. Anything else
is treated as transient and retried by Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from durable_agent import sampling
from durable_agent.activities._common import heartbeating, within
from durable_agent.activities._tools import turn_tools
from durable_agent.activities.parse_output import ParseOutputOutput, screened
from durable_agent.approval import consent_hash
from durable_agent.attachments import Attachment
from durable_agent.context_sources import MAX_DOCUMENTS, KeepsByReference
from durable_agent.elicitation import ANSWERS, Answer, NeedsAnswer, Question
from durable_agent.errors import ConsentMismatch, ToolError
from durable_agent.principal import Principal, of_customer
from durable_agent.render import render_result
from durable_agent.runtime import metrics, secret_refs
from durable_agent.sampling import Reply as SamplingReply
from durable_agent.sampling import Request as SamplingRequest
from durable_agent.secret import masked
from durable_agent.serving import Agents
from durable_agent.telemetry import tool_span
from durable_agent.tools import ToolContext
from durable_agent.types import ToolCall

_json = TypeAdapter(Any)

MAX_RESULT_BYTES = 64 * 1024
"""Larger tool results leave the activity as their rendered text, capped where the
model's reading of them is (`ServedAgent.result_limit`): the raw data of a huge
result would be stored for nothing."""


SCREEN_S = 5.0
"""At most this long for dispatch to screen its result (its shields may call a service)."""
SCREEN_MARGIN_S = 1.0
"""What the screen leaves of the activity's timeouts: it ends well before them."""


def _time_to_screen() -> float:
    """Seconds the running dispatch may spend screening its result: `SCREEN_S`, within
    what its timeouts leave (start to close, and schedule to close)."""
    info = activity.info()
    now = datetime.now(timezone.utc)
    left = SCREEN_S
    if info.start_to_close_timeout:
        used = (now - info.started_time).total_seconds()
        left = min(left, info.start_to_close_timeout.total_seconds() - used - SCREEN_MARGIN_S)
    if info.schedule_to_close_timeout:
        used = (now - info.scheduled_time).total_seconds()
        left = min(left, info.schedule_to_close_timeout.total_seconds() - used - SCREEN_MARGIN_S)
    return left


class DispatchInput(BaseModel):
    call: ToolCall
    customer_id: str
    """Trusted, from the turn's input: tools scope their data to it."""
    idempotency_key: str
    """`<workflow id>/<iteration>/<call index>`: the same on every retry of this call."""
    agent: str = ""
    """The turn's agent, whose tool this is (empty: the worker's first)."""
    tools_version: str = ""
    """The version of the agent's tools the turn started with (`AgentInfo.tools_version`)."""
    tool_lists: dict[str, str] = {}
    """Its MCP servers' lists, by hash (`AgentInfo.tool_lists`)."""
    context: dict[str, Any] = {}
    """The turn's context (`TurnInput.context`), for `ctx.context`."""
    answers: list[Answer] = []
    """Answers the turn recorded for this call's questions (`durable_agent.elicitation`):
    an MCP server that asks one of them again gets its answer."""
    replies: list[SamplingReply] = []
    """Replies the turn recorded for this call's sampling requests
    (`durable_agent.sampling`): an MCP server that asks one again gets its reply."""
    followed: int = 0
    """A replay in a world of its own (`Fork.own_world`): how many of the recording's
    calls, from its first, were answered from the record before this one
    (`ctx.followed`). Left out of the payload when 0, as every default is."""
    principal: Principal | None = None
    """Who asks (`TurnInput.asker`), for `ctx.principal`; None: the customer in the
    default tenant (calls recorded before principals)."""
    documents: list[Attachment] = Field(default_factory=list, max_length=MAX_DOCUMENTS)
    """The turn's attached documents, by reference, for `search_knowledge` only
    (`ctx.documents`): it searches them with the knowledge."""
    consent: str = ""
    """The hash of the call a person approved (`approval.consent_hash`), when one was
    asked: checked against this call before it runs, so that an approval of one call
    never lets another run (`ConsentMismatch`)."""


class DispatchOutput(BaseModel):
    result: Any = None
    """The tool's result as JSON data (pydantic models are dumped); see `as_read`."""
    parsed: ParseOutputOutput | None = None
    """The result as the model reads it, screened (`parse_output.screened`). None: the
    turn runs `parse_output` for it (a shield failed here; results recorded before
    dispatch did this; a tool's check)."""
    as_read: bool = False
    """The result is the text the model reads (`parsed`), so it is not there twice."""
    question: Question | None = None
    """The call asked the person a question the turn has no answer to (an MCP server's
    elicitation): no result; the turn asks, then sends the call again with the answer."""
    sampling: SamplingRequest | None = None
    """The call's MCP server asked for the agent's model, with no recorded reply: no
    result; the turn serves (or refuses) it, then sends the call again with the reply."""

    @property
    def data(self) -> Any:
        """The tool's result as JSON data."""
        if self.as_read and self.parsed is not None:
            return self.parsed.observation.text
        return self.result


class DispatchActivity:
    def __init__(self, agents: Agents) -> None:
        self._agents = agents

    @activity.defn(name="dispatch")
    async def dispatch(self, input: DispatchInput) -> DispatchOutput:
        return await self._run(input, check=False)

    @activity.defn(name="check")
    async def check(self, input: DispatchInput) -> DispatchOutput:
        """The tool's check of a call that needs consent (`Tool.check`): a read, run as
        a local activity before anyone is asked; its result says what will change."""
        return await self._run(input, check=True)

    async def _run(self, input: DispatchInput, check: bool) -> DispatchOutput:
        served = self._agents.get(input.agent)
        tools = await turn_tools(served, input.tools_version, input.tool_lists)
        tool = tools[input.call.name]
        args = tools.validate(input.call)
        if input.consent and input.consent != consent_hash(input.call):
            # The turn asked for this one; anything else is a bug, or a tampered input.
            raise ApplicationError(
                f"{input.call.name} was not run: its arguments are not those that were "
                "approved (an approval covers one exact call)",
                type=ConsentMismatch.__name__,
                non_retryable=True,
            )
        # The turn's secrets in clear, here only: what leaves this activity is masked.
        context, secrets = await secret_refs.revealed(input.context, input.customer_id)
        ctx = ToolContext(
            input.customer_id,
            served.deps,
            input.idempotency_key,
            context,
            input.followed,
            input.principal if input.principal is not None else of_customer(input.customer_id),
            input.documents,
        )
        run = tool.fn
        if check:
            if tool.check is None:
                raise ToolError(f"{tool.name} has no check")
            run = tool.check
        answers = {a.digest: a for a in input.answers}
        async with heartbeating():
            with tool_span(tool.name, input.call.id), metrics.tool_call(tool.name, served.name):
                token = ANSWERS.set(answers)
                replied = sampling.REPLIES.set({r.digest: r for r in input.replies})
                try:
                    with _masking(secrets):
                        if inspect.iscoroutinefunction(run):
                            result = await run(args, ctx)
                        else:
                            # Plain functions (SQLite, HTTP clients) run in a thread so
                            # the worker's event loop keeps serving other turns meanwhile.
                            result = await asyncio.to_thread(run, args, ctx)
                except NeedsAnswer as e:
                    activity.logger.info("%s %s: asks the person", tool.name, input.call.id)
                    return DispatchOutput(question=e.question)
                except sampling.NeedsSampling as e:
                    activity.logger.info("%s %s: asks for the model", tool.name, input.call.id)
                    return DispatchOutput(sampling=e.request)
                except ToolError as e:
                    if e.retryable:
                        raise
                    # An expected answer ("not found"), not an incident: benign keeps it
                    # out of the worker's error log and off the span's error status.
                    raise ApplicationError(
                        str(e),
                        type=type(e).__name__,
                        non_retryable=True,
                        category=ApplicationErrorCategory.BENIGN,
                    ) from e
                finally:
                    ANSWERS.reset(token)
                    sampling.REPLIES.reset(replied)
        # Names only: arguments are the customer's words, which logs must not hold.
        activity.logger.info("%s %s: ok", tool.name, input.call.id)
        data = masked(_json.dump_python(result, mode="json"), secrets)
        rendered = len(_json.dump_json(data)) > MAX_RESULT_BYTES
        if rendered:
            # Never store a huge result in the history: keep the compact text only.
            data = render_result(data, served.result_limit(tool.name, tools))
        if check:
            return DispatchOutput(result=data)
        # The tool has run: nothing after it may fail this activity or outlast its
        # timeouts, since a retry would run the tool again. A screen that cannot be done
        # here in time is left to the turn's own parse_output.
        parsed = None
        budget = _time_to_screen()
        if budget > 0:
            try:
                async with heartbeating():
                    parsed = await within(
                        screened(served, tools, input.call, data, input.customer_id, rendered),
                        budget,
                    )
            except Exception as e:
                activity.logger.warning(
                    "%s %s: result not screened here (%s)",
                    tool.name,
                    input.call.id,
                    type(e).__name__,
                )
        data, parsed = _recorded(served.sources, input.call.name, data, parsed)
        if parsed is not None and data == parsed.observation.text:
            return DispatchOutput(parsed=parsed, as_read=True)
        return DispatchOutput(result=data, parsed=parsed)


def _recorded(
    sources: Sequence[object], tool: str, data: Any, parsed: ParseOutputOutput | None
) -> tuple[Any, ParseOutputOutput | None]:
    """The result as the turn's record keeps it, screened already: a context source may
    keep words it must be able to delete from every turn by reference (a memory's, read
    back for each model call: `context_sources.KeepsByReference`)."""
    for source in sources:
        if not isinstance(source, KeepsByReference):
            continue
        if isinstance(data, str):
            data = source.recorded(tool, data)
        if parsed is not None:
            text = source.recorded(tool, parsed.observation.text)
            observation = parsed.observation.model_copy(update={"text": text})
            parsed = parsed.model_copy(update={"observation": observation})
    return data, parsed


@contextlib.contextmanager
def _masking(secrets: dict[str, Any]) -> Iterator[None]:
    """A tool's failure with the turn's secrets masked: its message is recorded in the
    history (and a span's events) as the activity's failure. The type is kept, so
    retry policies read it as before; the traceback is not, since it quotes the text."""
    try:
        yield
    except (NeedsAnswer, sampling.NeedsSampling):
        raise
    except ToolError as e:
        if secrets and str(e) != masked(str(e), secrets):
            e.args = (masked(str(e), secrets),)
        raise
    except Exception as e:
        text = str(e)
        if not secrets or text == masked(text, secrets):
            raise
        if isinstance(e, ApplicationError):  # the tool's own: its flags stand
            raise ApplicationError(
                masked(e.message, secrets),
                *masked(list(e.details), secrets),
                type=e.type,
                non_retryable=e.non_retryable,
                next_retry_delay=e.next_retry_delay,
                category=e.category,
            ) from None
        raise ApplicationError(masked(text, secrets), type=type(e).__name__) from None
