"""AgentTurn: one question, answered through tools, as one durable workflow.

    instructions            the agent's instructions for this turn, when they are a
                            function of its context (local activity; recorded, so a
                            replay never calls the function again)
    prices                  under a spending cap: every model of the turn has a price,
                            or the turn is refused before its first call (local activity)
    recheck                 a fork on the agent as served now (`rerun --current`): the
                            calls of its record against the tools now (local activity)
    plan                    model: tool calls for the question, or a direct answer
                            (an activity; a local one with `Agent.model_calls="local"`)
    for each round of calls (iterations, at most limits.max_steps):
        parse               validate the calls (local activity); when none is valid,
                            plan again with the errors, at most limits.max_replans times
        dispatch ×N         run the valid calls concurrently, each with its own policy
                            (quick reads as local activities, the rest as activities);
                            a call that needs consent first waits for a person's
                            decision (the `decide` update) or the approval timeout;
                            each result comes back as compact text, screened;
                            `wait` and `wait_for_event` (`durable_agent.waits`) are
                            no activity: a durable timer here, ended by its time, an
                            event (the `event` update) or a person (`wake`)
        parse_output        a result its dispatch could not screen (a shield failed
                            there) → compact text (local activity)
        interpret           model: the final answer, or the next round's calls
        compact             when the conversation fills the model's context window
                            even with older results shortened: model, a summary of
                            the older exchanges before the next call
                            (`durable_agent/compaction.py`)
    the whole turn is bounded by limits.max_duration: every activity is given at most
    the time left (no timer of its own), and the clock stops while a call waits for a
    decision or on a wait: a person's time is not the agent's, nor is the world's
    (a wait is bounded by limits.max_wait instead)
    a long turn continues as new near Temporal's history limits, between rounds (or
    while every open call of a round waits for a person), and its next run goes on
    where it stopped (`durable_agent/workflows/carry.py`): one turn, one workflow id

The model sees one conversation (`durable_agent/conversation.py`): the question, then its
own messages as it sent them and one result per call, in call order; a rejected
call's result is its error. Nothing else is added, so every call of a turn sends
the same system prompt and a conversation each provider accepts. A task of N
sequential rounds costs N + 1 model calls; parallel calls in a round cost none.

A turn may name several models in order (`durable_agent/fallback.py`): a model call
goes to the first, with its retries; when that model fails for good in a way another
may not, the next one gets the request, in an activity of its own, and the rest of
the turn's calls.
Before every model call the turn checks its token and cost budgets, and the call's
activity reserves from the budgets of the person it serves (`durable_agent.budgets`).

Durability notes. This code is replayed from history after a crash, so it must
be deterministic: no I/O, no clocks, no randomness, only `workflow.*` APIs.
Activities that completed are never re-run; a local activity (parse, a quick
read, a local model call) may run again if the worker dies before its result is
recorded: only reads, pure steps and model calls (whose only effect is their cost)
are local. Every expected failure (a tool error, a model that keeps failing, a cap)
ends in a graceful answer; an unexpected exception fails the workflow *task*, which
Temporal retries after a fix is deployed.
"""

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributeUpdate
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    RetryState,
    TimeoutError,
)

with workflow.unsafe.imports_passed_through():
    from durable_agent import answers, fallback, outputs, redact, rewind, sampling, waits
    from durable_agent.activities import (
        CompactActivity,
        CompactInput,
        DispatchActivity,
        DispatchInput,
        DispatchOutput,
        InstructionsActivity,
        InstructionsInput,
        InterpretActivity,
        InterpretInput,
        ParseActivity,
        ParseInput,
        ParseOutput,
        ParseOutputActivity,
        ParseOutputInput,
        ParseOutputOutput,
        PlanActivity,
        PlanInput,
        PricesActivity,
        PricesInput,
        RecheckActivity,
        RecheckInput,
        RetrieveActivity,
        RetrieveInput,
        SampleActivity,
        SampleInput,
        ShieldActivity,
        ShieldInput,
        ShieldOutput,
        ValidCall,
    )
    from durable_agent.approval import (
        MAX_UNASKED_WRITES,
        ApprovalDecision,
        ApprovalResult,
        consent_hash,
        declined,
        digest,
        expired,
        may_decide,
    )
    from durable_agent.attachments import Attachment
    from durable_agent.bounds import MAX_RESULTS_IN_FLIGHT_CHARS, fit_round, for_memo
    from durable_agent.context_sources import MAX_DOCUMENTS, SEARCH_TOOL
    from durable_agent.conversation import (
        BY_REFERENCE_CHARS,
        AssistantMessage,
        Message,
        ToolResult,
        UserMessage,
        by_reference,
        digest_of,
        prior,
    )
    from durable_agent.elicitation import (
        MAX_QUESTIONS_PER_CALL,
        Answer,
        AnswerInput,
        Question,
        check_answer,
    )
    from durable_agent.errors import (
        BudgetExceeded,
        BudgetSoftLimit,
        CannotFork,
        InvalidAnswer,
        InvalidEvent,
        ModelCannotAnswer,
        ModelRequestRejected,
        ModelUnavailable,
        NotAnApprover,
        NothingPending,
        NotWaiting,
        PayloadUnavailable,
        ToolListUnavailable,
        UnknownAgent,
        UnknownModel,
    )
    from durable_agent.model import Reply
    from durable_agent.pricing import usage_line
    from durable_agent.principal import Principal
    from durable_agent.provenance import Source
    from durable_agent.render import preview
    from durable_agent.runtime.metrics import count_fallback
    from durable_agent.shields import ShieldRequest, Verdict
    from durable_agent.stream import TURN_TOPIC, DoneEvent, StepEvent, carried
    from durable_agent.subagents import SubAgent
    from durable_agent.telemetry import agent_span, record_failure, record_fallback, record_turn
    from durable_agent.transcript import ConversationRef
    from durable_agent.types import (
        WAIVED,
        AgentInfo,
        Consent,
        Fork,
        Observation,
        Outcome,
        PendingApproval,
        RecordedCall,
        Step,
        StepKind,
        ToolCall,
        TurnInput,
        TurnLimits,
        TurnOutput,
        TurnProgress,
        Usage,
    )
    from durable_agent.workflows import search
    from durable_agent.workflows.carry import CarriedRound, TurnCarry
    from durable_agent.workflows.policies import (
        HEARTBEAT_TIMEOUT,
        INSTRUCTIONS_RETRY,
        INSTRUCTIONS_TIMEOUT,
        MODEL_RETRY,
        MODEL_TIMEOUT,
        PARSE_TIMEOUT,
        PRICES_TIMEOUT,
        QUICK_TIMEOUT,
        RECHECK_TIMEOUT,
        RETRIEVE_RETRY,
        RETRIEVE_TIMEOUT,
        SHIELD_RETRY,
        SHIELD_TIMEOUT,
        WORKFLOW_TASK_TIMEOUT,
        tool_retry,
    )


ModelInput = TypeVar("ModelInput", PlanInput, InterpretInput)

# Model errors that say the request can never succeed as configured.
_REFUSED = (ModelRequestRejected.__name__, UnknownModel.__name__, ModelCannotAnswer.__name__)

STREAM_KEEP = 50
"""Events of the turn's stream carried into its next run, within `CARRIED_BYTES`: a
reader further behind starts again from the oldest kept (the steps themselves are all
kept, run by run, in the runs' inputs)."""


class _Continue(Exception):
    """Raised inside the loop at a safe point: the turn goes on in a new run."""

    def __init__(self, carry: TurnCarry) -> None:
        super().__init__(f"continue as new: run {carry.run}")
        self.carry = carry


class _TurnEnded(Exception):
    """Raised inside the loop to end the turn with an answer (model failure, etc.)."""

    def __init__(self, outcome: Outcome, answer: str) -> None:
        super().__init__(answer)
        self.outcome = outcome
        self.answer = answer


class _ModelFailed(Exception):
    """Every model failed for good on a request that is not the turn's own (a server's
    request to sample): `said` is the failure as a customer may read it."""

    def __init__(self, said: str) -> None:
        super().__init__(said)
        self.said = said


SOFT_LINE_TOOL = "budget"
"""The name of the call a person approves to let a turn pass a budget's soft line."""


@workflow.defn(name="AgentTurn")
class AgentTurn:
    """Pinned (the agent workers' default behavior): a turn finishes on the worker
    version, code and agents, it started on, however long it waits for a person;
    its sub-agents' turns follow it (`durable_agent/runtime/deployments.py`)."""

    @workflow.init
    def __init__(self, turn: TurnInput) -> None:
        # State comes from the input here, not in `run`: a decision sent as the turn
        # continued as new may be the new run's first job, before `run` starts.
        carry = TurnCarry.of(turn)
        self._carry = carry
        self._names_agent = False
        """The turn sets AgentName and AgentFingerprint (started with AgentName)."""
        self._steps: list[Step] = []
        """The steps this run recorded (earlier runs': in each next run's input)."""
        self._earlier: list[Step] = carry.steps if carry else []
        """The steps the run before recorded (for the answers that sum up what was found)."""
        self._steps_before = carry.steps_before if carry else 0
        self._run_number = carry.run if carry else 1
        self._story: list[str] = []
        """The steps' lines in the Web UI's current details, each rendered once."""
        if carry is not None:
            self._story.append(
                answers.markdown_safe(
                    f"(run {carry.run} of this turn, after {carry.steps_before} steps "
                    "in its earlier runs)"
                )
            )
        self._usage = carry.usage if carry else Usage(cost_usd=0.0)  # starts at zero
        self._done = False
        self._messages: list[Message] = []
        self._first = carry.sent if carry else 0
        """The place in the conversation of `_messages[0]`: a run that continues the
        turn starts with none of it in memory (the activities read it by reference)."""
        self._sent = self._first
        """How many messages the previous model call had: the next one carries only the
        rest (`durable_agent/transcript.py`)."""
        self._model_calls = carry.model_calls if carry else 0
        """Model calls of the turn so far (all runs), for the number each one carries."""
        self._stored_texts: set[str] = set()
        """The digests of this run's long tool results that an activity's result holds:
        a model call names them there rather than storing them again (`_conversation`)."""
        self._full = carry.reply.context_full if carry else False
        """The last model call found the conversation filling its window: summarise
        older exchanges before the next one (`_compact`)."""
        self._consented: list[str] = list(carry.consented) if carry else []
        """Calls a person granted consent to: a summary keeps them word for word."""
        self._unasked: list[str] = list(carry.unasked) if carry else []
        """The writes this turn ran without asking (`approval.digest`): parse makes a
        repeat of one ask, so that a waiver covers each write once."""
        self._ahead: tuple[Reply, ParseOutput] | None = None
        """The last reply whose calls its model call parsed (`_parse_ahead`), with them."""
        self._budget_ok: list[str] = list(carry.budget_ok) if carry else []
        """Budgets (ledger ids, one per period) a person let this turn pass the soft line
        of: its model calls carry them (`ModelCallInput.budget_ok`), and it asks no more."""
        self._waived: dict[str, Consent] = {}
        """The record of each write about to run unasked, by call id, until its
        `tool_call` step carries it (the audit lists it: `durable_agent.audit`)."""
        self._progressed = False
        """This run has made a model call: it may continue as new (each run makes one)."""
        self._moving = False
        """Continuing as new: decisions that come now are carried, not acted on."""
        self._pending: dict[str, PendingApproval] = (
            {p.call.id: p for p in carry.pending} if carry else {}
        )
        self._decisions: dict[str, ApprovalDecision] = (
            {d.call_id: d for d in carry.decisions} if carry else {}
        )
        self._asker = Principal(user="-")
        """Who asked the turn (`TurnInput.asker`): whom approver rules are read against."""
        self._approved: dict[str, str] = {}
        """Calls approved and not yet dispatched: the hash each approval covers, which
        their dispatch checks (`DispatchInput.consent`). Never carried: a turn continues
        as new between rounds, and an approved call of a round is dispatched in it."""
        self._questions: dict[str, Question] = {}
        """MCP servers' questions awaiting a person's answer, by id (never carried: a
        turn does not continue as new while a call of its round waits for one)."""
        self._answers: dict[str, Answer] = {}
        self._may_sample: dict[str, bool | None] = dict(carry.may_sample) if carry else {}
        """Per MCP server, whether a person let it ask the agent's model in this turn
        (None: being asked). Asked once per server per turn: carried into the turn's
        next run."""
        self._model = carry.model if carry else ""
        self._tools_used: list[str] = list(carry.tools_used) if carry else []
        self._in_flight = 0
        """The result sizes of the calls running now (`ValidCall.result_chars`)."""
        self._status = carry.status if carry and carry.status else search.RUNNING
        self._tainted = carry.tainted if carry else False
        """A tool result carried instruction-like text: later writes need consent."""
        self._agent = carry.agent if carry else AgentInfo(name="")
        """Who answers, once the screen of the question has resolved the turn's agent."""
        self._limits = TurnLimits()
        self._started: datetime | None = carry.started if carry else None
        """When the clock of max_duration started (after the question's screen)."""
        self._paused = carry.paused if carry else timedelta(0)
        self._paused_since: datetime | None = carry.paused_since if carry else None
        """The clock stands still while some call waits for a person's decision."""
        self._instructions = ""
        """The agent's instructions as evaluated for this turn (`Agent(instructions=fn)`)."""
        self._models: list[str] = []
        """The models the turn asks, in order: the next one when one fails for good."""
        self._replied_by = ""
        """Which of several models gave the latest reply (empty: the turn has one)."""
        self._several_models = False
        """The turn names several models (its steps say which one answered)."""
        self._span: Any = None
        # The turn's story for whoever watches (`durable_agent/stream.py`): steps are added
        # here as they are recorded, which writes nothing to the history; the model
        # calls publish their text to it by signal when the turn asks them to. Its
        # offsets go on across the turn's runs.
        self._stream = WorkflowStream(carry.stream if carry else None)
        self._events = self._stream.topic(TURN_TOPIC)
        self._served = carry.served if carry and carry.served else rewind.Served()
        """In a fork: what its record has answered so far (`rewind.match`)."""
        self._waits: dict[str, waits.Waiting] = {}
        """The calls on a wait now (`wait`, `wait_for_event`), by id. A turn never
        continues as new while one waits (it is not parked for a person): no carry."""
        self._woken: dict[str, tuple[str | None, waits.WorldEvent | None]] = {}
        """Waits ended early, by call id: who woke them (`wake`), or the event."""

    @workflow.query
    def progress(self) -> TurnProgress:
        return TurnProgress(
            steps=self._steps,
            usage=self._usage,
            done=self._done,
            pending=list(self._pending.values()),
            questions=list(self._questions.values()),
            earlier_steps=self._steps_before,
        )

    @workflow.update
    async def answer(self, answer: AnswerInput) -> Question:
        """A person's answer to an MCP server's question (`durable_agent.elicitation`)."""
        return self._take(answer)

    def _take(self, answer: AnswerInput) -> Question:
        question = self._questions[answer.question_id]
        self._answers[question.id] = Answer(
            digest=question.digest, action=answer.action, content=answer.content, by=answer.by
        )
        return question

    @workflow.signal(name="answer_later")
    def answer_later(self, answer: AnswerInput) -> None:
        """An answer sent while no worker of the turn's version ran (`decide_later`'s
        kind): it applies when one runs the turn; one no longer awaited is dropped."""
        try:
            self._check_answer(answer)
        except ApplicationError as e:
            workflow.logger.warning("answer to %s dropped: %s", answer.question_id, e.message)
            return
        self._take(answer)

    @answer.validator
    def _check_answer(self, answer: AnswerInput) -> None:
        # Refused here, the update leaves no trace in the history.
        question = self._questions.get(answer.question_id)
        if question is None or question.id in self._answers:
            waiting = ", ".join(self._questions) or "none"
            raise ApplicationError(
                f"question {answer.question_id!r} is not awaiting an answer in this turn "
                f"(awaiting: {waiting})",
                type=NothingPending.__name__,
                non_retryable=True,
            )
        try:
            # Its shape here (the client checked it against the form; the worker checks it
            # again before the server gets it): `jsonschema` cannot run in the sandbox.
            check_answer(question, answer.action, answer.content, form=False)
        except InvalidAnswer as e:
            raise ApplicationError(
                str(e), type=InvalidAnswer.__name__, non_retryable=True
            ) from None

    @workflow.update
    async def decide(self, decision: ApprovalDecision) -> ApprovalResult:
        """A person's decision on a call that waits for consent. One from someone the
        agent's approvers leave out is refused (`NotAnApprover`), and its refusal is in
        the turn's story: accepted as an update, it is in the history too."""
        pending = self._pending[decision.call_id]
        if refusal := self._refusal(pending, decision):
            raise ApplicationError(refusal, type=NotAnApprover.__name__, non_retryable=True)
        self._decisions[decision.call_id] = decision
        call = pending.call
        return ApprovalResult(call_id=call.id, approved=decision.approved, tool=call.name)

    @workflow.signal(name="decide_later")
    def decide_later(self, decision: ApprovalDecision) -> None:
        """A decision sent while no worker of the turn's version ran: the server keeps
        it in the history, and it applies when one runs the turn. The client checked it
        against the calls the memo lists; one no longer awaiting a decision is dropped,
        and one from someone who may not decide is refused, in the story."""
        pending = self._pending.get(decision.call_id)
        if pending is None or decision.call_id in self._decisions:
            workflow.logger.warning("decision on %s dropped: not awaiting one", decision.call_id)
        elif not _covers(pending, decision):
            workflow.logger.warning("decision on %s dropped: made on another call", pending.call.id)
        elif not self._refusal(pending, decision):
            self._decisions[decision.call_id] = decision

    def _iteration_now(self) -> int:
        return self._steps[-1].iteration if self._steps else 1

    def _refusal(self, pending: PendingApproval, decision: ApprovalDecision) -> str:
        """Why the decider may not decide on `pending` (recorded in the story); empty
        when they may."""
        refusal = may_decide(pending.approvers, self._asker, decision.principal)
        if refusal:
            self._record(
                self._iteration_now(),
                StepKind.DECISION,
                f"{pending.call.name}: refused a decision by {decision.by}: {refusal}",
                calls=[pending.call],
                consent=_consent_of(pending, decision).model_copy(update={"refused": refusal}),
            )
        return refusal

    @decide.validator
    def _check_decision(self, decision: ApprovalDecision) -> None:
        # Refused here, an update leaves no trace in the history.
        if decision.call_id not in self._pending or decision.call_id in self._decisions:
            waiting = ", ".join(self._pending) or "none"
            raise ApplicationError(
                f"call {decision.call_id!r} is not awaiting approval in this turn "
                f"(awaiting: {waiting})",
                type=NothingPending.__name__,  # the client raises it as that
                non_retryable=True,
            )
        if not _covers(self._pending[decision.call_id], decision):
            raise ApplicationError(
                f"call {decision.call_id!r} awaiting approval is not the call decided on (its "
                "tool or arguments differ): read the turn's pending calls again",
                type=NothingPending.__name__,
                non_retryable=True,
            )

    @workflow.update
    def event(self, event: waits.WorldEvent) -> waits.Woke:
        """An event from the world: it ends every wait for an event of its name."""
        return self._arrived(event)

    @workflow.signal(name="event_later")
    def event_later(self, event: waits.WorldEvent) -> None:
        """An event sent while no worker ran the turn: the server keeps it in the
        history, and it applies when one runs the turn, as the update would have, if a
        wait for its name is still open; otherwise it is dropped (`runtime/turns.py`)."""
        try:
            self._check_event(event)
        except ApplicationError as e:
            workflow.logger.warning("event %s dropped: %s", event.name[:64], e.message)
            return
        self._arrived(event)

    @event.validator
    def _check_event(self, event: waits.WorldEvent) -> None:
        # Refused here, an update leaves no trace in the history.
        try:
            waits.checked_event(event)
        except InvalidEvent as e:
            raise ApplicationError(str(e), type=InvalidEvent.__name__, non_retryable=True) from None
        if not any(w.event == event.name for _, w in self._open_waits()):
            names = sorted({repr(w.event) for _, w in self._open_waits() if w.event})
            raise ApplicationError(
                f"turn {workflow.info().workflow_id} waits for no event {event.name!r} "
                f"(waiting for: {', '.join(names) or 'none'})",
                type=NotWaiting.__name__,
                non_retryable=True,
            )

    @workflow.update
    def wake(self, wake: waits.Wake) -> waits.Woke:
        """A person ends the turn's waits early; the model reads who woke it, and when."""
        return self._woke(wake)

    @workflow.signal(name="wake_later")
    def wake_later(self, wake: waits.Wake) -> None:
        """A wake-up sent while no worker ran the turn (see `event_later`)."""
        if self._open_waits():
            self._woke(wake)
        else:
            workflow.logger.warning("wake-up dropped: the turn waits for nothing")

    @wake.validator
    def _check_wake(self, wake: waits.Wake) -> None:
        if not self._open_waits():
            raise ApplicationError(
                f"turn {workflow.info().workflow_id} is not waiting (no wait or "
                "wait_for_event of it runs now)",
                type=NotWaiting.__name__,
                non_retryable=True,
            )

    def _arrived(self, event: waits.WorldEvent) -> waits.Woke:
        ended = [c for c, w in self._open_waits() if w.event == event.name]
        for call_id in ended:
            self._woken[call_id] = (None, event)
        return waits.Woke(calls=ended, tools=[waits.wait_for_event.name] * len(ended))

    def _woke(self, wake: waits.Wake) -> waits.Woke:
        ended = self._open_waits()
        for call_id, _ in ended:
            self._woken[call_id] = (wake.by, None)
        return waits.Woke(
            calls=[c for c, _ in ended],
            tools=[waits.wait_for_event.name if w.event else waits.wait.name for _, w in ended],
        )

    def _open_waits(self) -> list[tuple[str, waits.Waiting]]:
        """The waits that nothing has ended yet, in the order they began."""
        return [(c, w) for c, w in self._waits.items() if c not in self._woken]

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnOutput:
        self._asker = turn.asker
        with agent_span(turn.agent, turn.model, turn.conversation_id) as span:
            self._span = span
            result = await self._run(turn)
            if isinstance(result, TurnOutput):
                record_turn(span, result.agent, result.outcome.value, result.usage)
        if isinstance(result, TurnCarry):
            # The same turn, by the same workflow id, in a new run: a new history.
            workflow.continue_as_new(result.input(turn))
        done = DoneEvent(
            outcome=result.outcome, answer=result.answer, usage=result.usage, output=result.output
        )
        self._events.publish(done.model_dump(mode="json"))
        # Readers waiting on the stream get its last events before the turn closes;
        # later ones read them by query.
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    async def _run(self, turn: TurnInput) -> TurnOutput | TurnCarry:
        self._names_agent = _named()
        if self._carry is not None:
            # A run that continues the turn: its question was screened, its agent known.
            self._limits = _capped(
                turn.limits or self._agent.limits or TurnLimits(), turn.cost_left
            )
            return await self._looping(turn)
        # Screen the question first: it also resolves the turn's agent, who answers
        # and with which limits.
        question = ShieldRequest(
            position="input", text=turn.question, attachments=list(turn.attachments)
        )
        self._agent = AgentInfo(name=turn.agent)
        try:
            (stop,), screened = await self._screen(turn, 1, [question])
        except _TurnEnded as end:
            return self._finish(end.outcome, end.answer)
        if screened is not None and screened.agent is not None:
            self._agent = screened.agent
        fork = turn.fork
        if fork is not None and not fork.current and not fork.instructions:
            # A fork whose parent's instructions a function gave is checked once that
            # text is fingerprinted (`_prepare`); one on the agent as served now, never.
            self._same_agent(fork)
        self._limits = _capped(turn.limits or self._agent.limits or TurnLimits(), turn.cost_left)
        if stop:
            refusal = screened.refusal if screened else ""
            return self._finish(Outcome.REFUSED, refusal or answers.REFUSED_QUESTION)
        # max_duration costs the turn no timer: each activity gets at most the time
        # left (`_within`), so the one running when the time is up stops then, and the
        # answer uses what the steps found so far.
        self._started = workflow.now()
        return await self._looping(turn)

    async def _looping(self, turn: TurnInput) -> TurnOutput | TurnCarry:
        """The loop's answer, or where it stopped for the next run to go on."""
        try:
            if self._carry is None:
                await self._prepare(turn)
            else:
                self._restore(turn, self._carry)
            return await self._loop(turn, self._carry)
        except _TurnEnded as end:
            return self._finish(end.outcome, end.answer)
        except _Continue as moving:
            return moving.carry

    async def _prepare(self, turn: TurnInput) -> None:
        """What the first model call needs settled: which models, in order; the agent's
        instructions for this turn, when they are a function (a plain text costs
        nothing here); and, under a spending cap, a price for every one of the models."""
        self._models = fallback.specs(turn.model) or self._agent.models or [turn.model]
        self._several_models = len(self._models) > 1
        fork = turn.fork
        if fork is not None and fork.instructions and not fork.current:
            await self._as_parent_ran(turn, fork)
        elif self._agent.dynamic_instructions and not turn.instructions:
            # A fork on the agent as served now: evaluated again, from the parent's context.
            self._instructions = await self._instructions_for(turn)
        if self._limits.max_cost is not None:
            await self._priced(self._limits.max_cost)

    async def _as_parent_ran(self, turn: TurnInput, fork: Fork) -> None:
        """A fork of a turn whose agent's instructions a function gave: the fork runs the
        text its parent got (unless it was given its own), never the function, and the
        agent it runs must be the one its parent ran: that text and the same tools."""
        if self._agent.dynamic_instructions:
            text = await self._instructions_for(turn, fork.instructions)
            if not turn.instructions:
                self._instructions = text
        self._same_agent(fork)

    def _same_agent(self, fork: Fork) -> None:
        """A fork runs the agent its parent ran (its fingerprint), or fails in one line."""
        if mismatch := rewind.agent_mismatch(fork, self._agent):
            raise ApplicationError(mismatch, type=CannotFork.__name__, non_retryable=True)

    async def _instructions_for(self, turn: TurnInput, recorded: str = "") -> str:
        """Evaluated once, as a local activity whose result the history records: a
        replay reads the text, and the turn's fingerprint becomes that of the text.
        `recorded`: a fork's parent's text, fingerprinted as it is (not evaluated)."""
        try:
            out = await _local(
                InstructionsActivity.instructions,
                InstructionsInput(
                    agent=self._agent.name,
                    context=turn.context,
                    customer_id=turn.customer_id,
                    tools_version=self._agent.tools_version,
                    tool_lists=self._agent.tool_lists,
                    text=recorded,
                    principal=turn.asker,
                ),
                start_to_close_timeout=INSTRUCTIONS_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                retry_policy=INSTRUCTIONS_RETRY,
                summary="instructions",
            )
        except (ActivityError, ApplicationError) as e:
            self._if_out_of_time()
            self._if_tools_lost(1, e)
            self._record(1, StepKind.LIMIT, self._failed("instructions: could not be prepared", e))
            raise _TurnEnded(Outcome.MODEL_ERROR, answers.instructions_failed()) from None
        self._agent = self._agent.model_copy(update={"fingerprint": out.fingerprint})
        return out.text

    async def _priced(self, cap: float) -> None:
        """A cap is kept only if every model's calls can be priced: a model whose price
        nobody knows refuses the turn before its first call, naming the model."""
        try:
            out = await _local(
                PricesActivity.prices,
                PricesInput(models=self._models, agent=self._agent.name),
                start_to_close_timeout=PRICES_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                retry_policy=INSTRUCTIONS_RETRY,
                summary="prices",
            )
            unpriced = out.unpriced
        except (ActivityError, ApplicationError) as e:
            self._if_out_of_time()
            models = ", ".join(self._models) or "the default"
            unpriced = [self._failed(f"{models} (its prices could not be read)", e)]
        if unpriced:
            raise _TurnEnded(Outcome.COST_LIMIT, answers.unpriced(cap, unpriced))

    def _restore(self, turn: TurnInput, carry: TurnCarry) -> None:
        """What `_prepare` settled, as the run before had it: the instructions are not
        evaluated again, and a model that failed is not asked again."""
        self._models = carry.models or fallback.specs(turn.model) or self._agent.models
        self._models = self._models or [turn.model]
        self._several_models = len(self._models) > 1
        self._instructions = carry.instructions

    async def _loop(self, turn: TurnInput, carry: TurnCarry | None) -> TurnOutput:
        carried: CarriedRound | None = None
        if carry is None:
            self._messages = [*prior(turn.history), UserMessage.of(turn)]
            iteration, replans, source = 1, 0, StepKind.PLAN
            if turn.fork is not None:
                # Another turn's conversation up to one of its steps (`client.py rerun`).
                reply, iteration, source = await self._forked(turn, turn.fork)
            else:
                await self._retrieve(turn)
                reply = await self._plan(turn, iteration, f"plan: {_clip(turn.question)}")
        else:
            iteration, replans, source = carry.iteration, carry.replans, carry.source
            reply, carried = carry.reply, carry.round
        while reply.calls:
            if carried is not None:
                # The round the run before left while its calls waited for people.
                valid, results = carried.valid, dict(carried.done)
                carried = None
            else:
                if self._due():
                    # Between rounds: the history nears Temporal's limits.
                    raise await self._move(turn, reply, iteration, replans, source)
                self._record(
                    iteration, source, _describe(reply), calls=reply.calls, **self._by(reply)
                )
                if iteration > self._limits.max_steps:
                    # The model still wants tools: stop here, with what was found.
                    answer = answers.step_limit(self._limits.max_steps, self._found())
                    return self._finish(Outcome.STEP_LIMIT, answer)

                parsed = self._parsed_ahead(reply) or await self._parse(
                    turn, iteration, reply.calls, turn.tools
                )
                results = {
                    r.call.id: self._reject(iteration, r.call, r.error) for r in parsed.rejected
                }
                valid = self._screened(iteration, parsed, results)
                if not valid and replans < self._limits.max_replans and parsed.rejected:
                    # Nothing can run: the model reads the errors and fixes its calls.
                    replans += 1
                    self._answer(reply, results)
                    reply = await self._plan(turn, iteration, f"re-plan #{replans}")
                    source = StepKind.PLAN
                    continue

            here = (turn, reply, iteration, replans, source)
            observations = await self._round(here, valid, results)
            results.update((o.call_id, o) for o in observations)
            self._answer(reply, results)
            ran = zip(valid, observations, strict=True)
            direct = [o.text for vc, o in ran if vc.return_direct and o.ok]
            whole = len(direct) == len(reply.calls)
            if direct and whole and not self._typed(turn):
                # Return-direct results are the answer: no interpret. Only when every
                # call of the round is one and succeeded: else the model reads them all
                # (and in a typed turn, the model gives the value).
                return await self._answered(turn, iteration, " ".join(direct))
            reply = await self._interpret(turn, iteration, f"interpret: {len(results)} result(s)")
            if reply.calls:
                iteration, replans, source = iteration + 1, 0, StepKind.CONTINUE

        if reply.output is not None:
            return await self._answered(turn, iteration, reply.output, typed=True, reply=reply)
        return await self._answered(turn, iteration, reply.text, reply=reply)

    async def _retrieve(self, turn: TurnInput) -> None:
        """Seed 004's retrieval step, for an agent whose knowledge asks for it: the
        question's top passages, with their ids and sources, join the conversation as
        the result of a search call (data, never instructions), before the first model
        call. It fails open: the turn goes on without them, and its story says why."""
        if not self._agent.retrieve:
            return
        try:
            out = await _local(
                RetrieveActivity.retrieve,
                RetrieveInput(
                    agent=self._agent.name,
                    question=turn.question,
                    customer_id=turn.customer_id,
                    asker=turn.asker,
                    documents=self._documents(),
                ),
                start_to_close_timeout=RETRIEVE_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                retry_policy=RETRIEVE_RETRY,
                summary="retrieve",
            )
        except (ActivityError, ApplicationError) as e:
            self._if_out_of_time()
            self._record(1, StepKind.RETRIEVE, self._failed("retrieve: no passages", e))
            return
        call = out.call
        observation = Observation(call_id=call.id, tool=call.name, ok=True, text=out.text)
        shown = observation.model_copy(update={"text": preview(out.text)})
        line = f"retrieve: {out.passages} passage(s) for the question"
        line += f", {out.recalled} of them from memory" if out.recalled else ""
        self._record(1, StepKind.RETRIEVE, line, calls=[call], observation=shown)
        stop = self._judged(1, "tool_output", call, out.verdicts)
        self._tainted = self._tainted or stop is not None  # data, never instructions
        self._messages += [AssistantMessage(calls=[call]), ToolResult.of(observation)]

    def _documents(self) -> list[Attachment]:
        """The attached documents (not images) of the conversation so far, the newest
        `MAX_DOCUMENTS`, once each: what the retrieval step searches besides the
        knowledge (by reference: the activity reads their bytes)."""
        found = {
            a.sha256: a
            for m in self._messages
            if isinstance(m, UserMessage)
            for a in m.attachments
            if not a.is_image
        }
        if not found:
            return []
        return list(found.values())[-MAX_DOCUMENTS:]

    def _by(self, reply: Reply) -> dict[str, Any]:
        """What the step that records `reply` says of the call that gave it: which model
        (of several), and the settings it was given."""
        return {
            "model": self._replied_by,
            "settings": reply.settings,
            "settings_ignored": reply.settings_ignored,
        }

    async def _answered(
        self,
        turn: TurnInput,
        iteration: int,
        answer: str,
        typed: bool = False,
        reply: Reply | None = None,
    ) -> TurnOutput:
        """The answer, once the output shields let it through (a typed value: its JSON).
        What it may draw on is the conversation, which the shield activity reads
        (`ConversationRef`), and instructions evaluated for this turn."""
        request = ShieldRequest(
            position="output", text=answer, context=self._own(), customer_id=turn.customer_id
        )
        (stop,), screened = await self._screen(turn, iteration, [request], self._conversation_ref())
        if stop:
            refusal = screened.refusal if screened else ""
            raise _TurnEnded(Outcome.REFUSED, refusal or answers.REFUSED_ANSWER)
        self._record(iteration, StepKind.ANSWER, answer, **(self._by(reply) if reply else {}))
        if not typed:
            return self._finish(Outcome.ANSWERED, answer)
        # Where the agent's own type is defined, for a client that has it (never a type
        # the turn was given: that is its caller's).
        own = self._agent.output if turn.output is None else None
        return self._finish(
            Outcome.ANSWERED, answer, json.loads(answer), own.python if own is not None else ""
        )

    def _own(self) -> list[str]:
        """Instructions evaluated for this turn, which an answer or a call may draw on as
        on the agent's own (the shield activity adds them to the conversation's)."""
        return [self._instructions] if self._instructions else []

    def _conversation_ref(self) -> ConversationRef:
        """The conversation as the activities that read it find it: as the last model
        call had it (their worker's copy, or the turn's record), and what came since."""
        return ConversationRef(
            turn=workflow.info().first_execution_run_id,
            call=self._model_calls,
            after=self._messages[self._sent - self._first :],
        )

    def _screened(
        self, iteration: int, parsed: ParseOutput, results: dict[str, Observation]
    ) -> list[ValidCall]:
        """The valid calls the tool-input shields let through (parse screened them); the
        others are rejected, with the shield's words as their result."""
        judged = parsed.verdicts or [[] for _ in parsed.valid]
        through = []
        for vc, verdicts in zip(parsed.valid, judged, strict=True):
            stop = self._judged(iteration, "tool_input", vc.call, verdicts)
            if stop is None:
                through.append(vc)
                continue
            text = f"blocked by the {stop.shield} shield ({stop.category}): {stop.message}"
            results[vc.call.id] = Observation(
                call_id=vc.call.id, tool=vc.call.name, ok=False, text=text
            )
        return through

    async def _screen(
        self,
        turn: TurnInput,
        iteration: int,
        requests: list[ShieldRequest],
        conversation: ConversationRef | None = None,
    ) -> tuple[list[Verdict | None], ShieldOutput | None]:
        """Run the shields on each request; per request, its violation (None: allowed),
        and what the shield activity said (None: it could not run at all). A shield step
        is recorded for each request some shield judged. An unknown agent ends the turn."""
        position = requests[0].position
        out: ShieldOutput | None = None
        try:
            out = await _local(
                ShieldActivity.shield,
                ShieldInput(requests=requests, agent=self._agent.name, conversation=conversation),
                start_to_close_timeout=SHIELD_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                retry_policy=SHIELD_RETRY,
                summary=answers.markdown_safe(f"shield: {position}"),
            )
            judged = out.verdicts
        except (ActivityError, ApplicationError) as e:
            # A local activity's failure may arrive unwrapped (ApplicationError).
            self._if_out_of_time()
            self._if_record_lost(iteration, e)
            cause = _cause(e)
            if isinstance(cause, ApplicationError) and cause.type == UnknownAgent.__name__:
                self._record(iteration, StepKind.LIMIT, f"agent: {cause.message}")
                answer = answers.unknown_agent(cause.message)
                raise _TurnEnded(Outcome.UNKNOWN_AGENT, answer) from None
            unscreened = self._unscreened(e)
            judged = [[unscreened] for _ in requests]
        stops = [
            self._judged(iteration, request.position, request.call, verdicts)
            for request, verdicts in zip(requests, judged, strict=True)
        ]
        return stops, out

    def _judged(
        self, iteration: int, position: str, call: ToolCall | None, verdicts: list[Verdict]
    ) -> Verdict | None:
        """The first violation among the verdicts (None: allowed); a shield step when
        some shield judged."""
        stop = next((v for v in verdicts if not v.allowed), None)
        if verdicts:
            self._record(iteration, StepKind.SHIELD, _verdict_line(position, call, verdicts, stop))
        return stop

    async def _plan(self, turn: TurnInput, iteration: int, summary: str) -> Reply:
        """The model's first calls (or answer): the turn parses them at `iteration`."""
        await self._compact(turn, iteration)
        arg = self._parse_ahead(turn, iteration, self._conversation(PlanInput, turn))
        out = await self._model_call(turn, iteration, PlanActivity.plan, arg, summary)
        reply: Reply = out.plan
        self._kept_ahead(reply, out.parsed)
        self._full = reply.context_full
        self._usage += reply.usage
        self._model = out.model  # the spec the worker resolved, for AgentModel
        return await self._fitting(turn, iteration, reply, iteration)

    async def _interpret(self, turn: TurnInput, iteration: int, summary: str) -> Reply:
        """The model's answer to round `iteration`, or its next calls: the turn parses
        those at `iteration + 1`."""
        reply = await self._decide(turn, iteration, summary, iteration + 1)
        return await self._fitting(turn, iteration, reply, iteration + 1)

    async def _decide(self, turn: TurnInput, iteration: int, summary: str, parse_at: int) -> Reply:
        await self._compact(turn, iteration)
        arg = self._parse_ahead(turn, parse_at, self._conversation(InterpretInput, turn))
        out = await self._model_call(turn, iteration, InterpretActivity.interpret, arg, summary)
        reply: Reply = out.decision
        self._kept_ahead(reply, out.parsed)
        self._full = reply.context_full
        self._usage += reply.usage
        if self._replied_by:
            self._model = self._replied_by
        return reply

    def _parse_ahead(self, turn: TurnInput, parse_at: int, arg: ModelInput) -> ModelInput:
        """A local model call's input, asking it to parse its reply's calls (in the
        same process, with what `_parse_once` would send then: the conversation as this
        call has it, nothing after), so that a step is one local activity, not two.
        Not asked: a call made as an activity (its input is in the history, which would
        then hold the customer's words and the earlier answers at every call), nor a
        reply whose calls the turn would not parse (past `max_steps`)."""
        if self._agent.model_calls != "local" or turn.stream:
            return arg
        # Asked of no `workflow.patched`: what the turn does follows the recorded result
        # (a reply recorded without its calls parsed, as before this, the turn parses in
        # a `parse` of its own), so histories of either kind replay, and no turn pays a
        # patch's marker (docs/deploy.md).
        if parse_at > self._limits.max_steps:
            return arg
        ref = ConversationRef(turn=workflow.info().first_execution_run_id, call=arg.call)
        return arg.model_copy(update={"parse": self._parse_input(turn, [], turn.tools, ref)})

    def _kept_ahead(self, reply: Reply, parsed: ParseOutput | None) -> None:
        self._ahead = (reply, parsed) if parsed is not None else None

    def _parsed_ahead(self, reply: Reply) -> ParseOutput | None:
        """`reply`'s calls as its model call parsed them; None: the turn parses them (a
        call not asked to, a parse that failed there, a reply carried from another run)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or ahead[0] is not reply:
            return None
        return ahead[1].restored(reply.calls)

    async def _compact(self, turn: TurnInput, iteration: int) -> None:
        """Before a model call, when the last one found the conversation filling the
        model's window: the model summarises everything between the question and the
        latest round, and the conversation goes on as those three. The next call
        carries it whole (and the turn's record starts the conversation there)."""
        if not self._full:
            return
        self._full = False
        latest = next(
            (
                i
                for i in range(len(self._messages) - 1, -1, -1)
                if isinstance(m := self._messages[i], AssistantMessage) and m.calls
            ),
            None,
        )
        if latest is None:
            return  # nothing since this run began to keep: the next round compacts
        self._within_budget()
        kept = self._messages[latest:]
        arg = CompactInput(
            model=self._models[0] if self._models else turn.model,
            agent=self._agent.name,
            conversation=self._conversation_ref(),
            question=turn.question,
            kept=len(kept),
            consented=self._consented,
            settings=turn.settings,
            principal=turn.asker,
            budget_ok=self._budget_ok,
        )
        try:
            out = await workflow.execute_activity_method(
                CompactActivity.compact,
                arg,
                start_to_close_timeout=MODEL_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=MODEL_RETRY,
                summary="compact: summarise older exchanges",
            )
        except ActivityError as e:
            self._if_out_of_time()
            self._if_over_budget(e)
            why = fallback.reason(_cause(e))
            line = f"context: no summary ({why}); older results stay shortened"
            self._record(iteration, StepKind.COMPACT, self._failed(line, e))
            return
        self._usage += out.usage
        first = kept[0]
        assert isinstance(first, AssistantMessage)
        text = f"{out.text}\n\n{first.text}" if first.text else out.text
        self._messages = [
            UserMessage.of(turn),
            first.model_copy(update={"text": text}),
            *kept[1:],
        ]
        self._first = self._sent = 0
        by = "" if out.written_by == "model" else f" ({out.written_by})"
        line = f"context: {out.summarised} earlier messages summarised{by}"
        self._record(iteration, StepKind.COMPACT, line)

    async def _fitting(self, turn: TurnInput, iteration: int, reply: Reply, parse_at: int) -> Reply:
        """In a typed turn: a reply whose value fits the type (or that calls tools
        first). A value that does not fit goes back to the model with its errors, at
        most max_replans times; then the turn ends `invalid_output`. A text turn's
        replies pass as they are (the activity sets no error for them)."""
        repairs = 0
        while reply.output_error:
            self._record(iteration, StepKind.REJECTED, f"output: rejected: {reply.output_error}")
            if repairs >= self._limits.max_replans:
                answer = answers.invalid_output(reply.output_error, repairs)
                raise _TurnEnded(Outcome.INVALID_OUTPUT, answer)
            repairs += 1
            self._messages.extend(outputs.repair(reply.message(), reply.output_error))
            reply = await self._decide(turn, iteration, f"repair output #{repairs}", parse_at)
        return reply

    def _typed(self, turn: TurnInput) -> bool:
        """The turn ends with a value of a type (its own, or its agent's)."""
        return turn.output is not None or self._agent.output is not None

    def _conversation(self, kind: type[ModelInput], turn: TurnInput) -> ModelInput:
        """A model call's input: what the conversation gained since the previous call
        (the activity puts it together with what that call had), and what the turn sets.
        Each message enters the history once: a turn's history grows with its steps."""
        since, self._sent = self._sent, self._first + len(self._messages)
        self._model_calls += 1
        messages = self._messages[since - self._first :]
        if self._stored_texts:
            # Each tool result is stored once: in the activity's result that screened it.
            messages = by_reference(messages, self._stored_texts)
        return kind(
            model=turn.model,
            messages=messages,
            since=since,
            call=self._model_calls,
            turn=workflow.info().first_execution_run_id,
            tools=turn.tools,
            instructions=turn.instructions or self._instructions,
            stream=turn.stream,
            agent=self._agent.name,
            tools_version=self._agent.tools_version,
            tool_lists=self._agent.tool_lists,
            output=turn.output,
            settings=turn.settings,
            principal=turn.asker,
            budget_ok=self._budget_ok,
        )

    async def _model_call(  # type: ignore[no-untyped-def]
        self, turn: TurnInput, iteration: int, method, arg, summary: str, *, ends_turn: bool = True
    ):
        """The model's answer, asking the next model when one fails in a way another may
        not; the last failing ends the turn (`_model_failed`), or, `ends_turn=False` (a
        server's request to sample: its call, not the turn, is what fails), raises
        `_ModelFailed` for the caller to say so."""
        self._within_budget()
        # One activity per model, each with its own retries; the next model gets the
        # request only when one failed for good in a way another may not (fallback.py).
        models, several = list(self._models), self._several_models
        for i, spec in enumerate(models):
            within = self._within(fallback.share(self._time_left(), len(models) - i))
            shown = answers.markdown_safe(f"{summary} ({spec})" if several else summary)
            sent = arg.model_copy(update={"model": spec})
            try:
                while True:
                    try:
                        out = await self._execute_model_call(turn, method, sent, within, shown)
                        break
                    except (ActivityError, ApplicationError) as e:
                        if not await self._may_pass_soft_line(turn, iteration, e):
                            raise
                        # Approved: the same call again, now carrying the approval.
                        sent = sent.model_copy(update={"budget_ok": list(self._budget_ok)})
            except (ActivityError, ApplicationError) as e:
                # A local activity's failure may arrive unwrapped (ApplicationError).
                self._if_out_of_time()
                self._if_over_budget(e)
                if i + 1 == len(models) or not fallback.next_may_answer(_cause(e)):
                    if not ends_turn:
                        self._if_tools_lost(iteration, e)
                        said, _ = self._model_failure(spec, e)
                        raise _ModelFailed(self._failed(said, e)) from e
                    raise self._model_failed(iteration, spec, e) from e
                self._fell_back(iteration, spec, models[i + 1], e)
                # The failed model is asked no more in this turn: the next calls go
                # straight to the model that answers.
                self._models = models[i + 1 :]
                continue
            self._replied_by = spec if several else ""
            self._progressed = True
            return out
        raise ApplicationError("a turn asks at least one model", non_retryable=True)

    async def _execute_model_call(  # type: ignore[no-untyped-def]
        self, turn: TurnInput, method, sent, within: timedelta | None, shown: str
    ):
        if self._agent.model_calls == "local" and not turn.stream:
            # Inside this workflow task: its marker records what was sent too.
            # (A streamed turn's calls are activities: the workflow takes the
            # text they publish as it comes, not once its task completes.)
            return await _local(
                method,
                sent,
                start_to_close_timeout=MODEL_TIMEOUT,
                schedule_to_close_timeout=within,
                retry_policy=MODEL_RETRY,
                summary=shown,
            )
        return await workflow.execute_activity_method(
            method,
            sent,
            start_to_close_timeout=MODEL_TIMEOUT,
            schedule_to_close_timeout=within,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=MODEL_RETRY,
            summary=shown,
        )

    async def _may_pass_soft_line(self, turn: TurnInput, iteration: int, err: Exception) -> bool:
        """A model call would pass a budget's soft line (`BudgetSoftLimit`): a person is
        asked, as for a write (the turn's pending list, `approve`/`reject`, the approval
        timeout), whether the turn may go on up to the cap. True: approved, for this
        budget's period. Declined or unanswered: the turn ends with `budget_limit`.
        False: not such a failure (or one already approved: never asked twice)."""
        cause = _cause(err)
        if not isinstance(cause, ApplicationError) or cause.type != BudgetSoftLimit.__name__:
            return False
        past = cause.details[0] if cause.details else None
        if not isinstance(past, dict) or not isinstance(ledger := past.get("ledger"), str):
            return False
        if ledger in self._budget_ok:
            return False
        # A call of no tool, named `budget`: its arguments say which budget, and the
        # decision's record (approver, time, hash) is kept as a write's is.
        call = ToolCall(
            id=f"budget-{len(self._budget_ok) + 1}",
            name=SOFT_LINE_TOOL,
            arguments={"ledger": ledger, "spent": past.get("spent"), "cap": past.get("cap")},
        )
        why = f"{cause.message}; approve to go on up to the cap"
        # Who may decide is the cap's to say (`Cap.approvers`, from the activity that
        # saw it): recorded in the failure, so a replay reads the same; none: anyone.
        named = past.get("approvers")
        approvers = [r for r in named if isinstance(r, str)][:16] if isinstance(named, list) else []
        refused = await self._consent(turn, iteration, call, why, approvers=approvers)
        # Nothing is dispatched under it, and no summary is to quote it as a write.
        self._approved.pop(call.id, None)
        if call.id in self._consented:
            self._consented.remove(call.id)
        if refused is None:
            self._budget_ok.append(ledger)
            return True
        decided = next(s.text for s in reversed(self._steps) if s.kind is StepKind.DECISION)
        said = decided.removeprefix(f"{call.name}: ")
        answer = answers.budget_limit(f"{cause.message}; going on was {said}", self._found())
        raise _TurnEnded(Outcome.BUDGET_LIMIT, answer)

    def _within_budget(self) -> None:
        """Before a model call, never after: an answer already paid for is kept."""
        budget = self._limits.max_tokens
        if budget is not None and self._usage.total_tokens >= budget:
            # Checked before a call, never after: an answer already paid for is kept.
            raise _TurnEnded(Outcome.TOKEN_LIMIT, answers.token_limit(budget, self._found()))
        cap = self._limits.max_cost
        spent = self._usage.cost_usd
        if cap is not None and (spent is None or spent >= cap):
            # A cost nobody knows is no cost within the cap.
            raise _TurnEnded(Outcome.COST_LIMIT, answers.cost_limit(cap, spent, self._found()))

    def _if_over_budget(self, err: Exception) -> None:
        """A budget of the person served refused the call (`durable_agent.budgets`): the
        turn ends, whichever model or kind of call it was. No other model is asked: a
        budget holds for every model."""
        cause = _cause(err)
        if not isinstance(cause, ApplicationError) or cause.type != BudgetExceeded.__name__:
            return
        answer = answers.budget_limit(cause.message, self._found())
        raise _TurnEnded(Outcome.BUDGET_LIMIT, answer)

    def _fell_back(self, iteration: int, failed: str, then: str, err: Exception) -> None:
        """The story, the trace and the metrics say that the next model gets the request:
        the story names the models and the kind of failure only (`fallback.reason`)."""
        why = fallback.reason(_cause(err))
        self._record(iteration, StepKind.FALLBACK, f"{failed} failed ({why}); asking {then}")
        said = redact.mask(_failure(err))
        workflow.logger.warning("model %s failed (%s): %s; asking %s", failed, why, said, then)
        record_fallback(self._span, failed, then, why, said)
        count_fallback(self._agent.name, failed, then)

    def _model_failed(
        self, iteration: int, spec: str, err: ActivityError | ApplicationError
    ) -> _TurnEnded:
        """Transient trouble that outlasted every retry, or a request a retry cannot fix.
        The step and the answer say which kind; the error's own words go to the log and
        the trace (`_failed`)."""
        self._if_tools_lost(iteration, err)
        said, answer = self._model_failure(spec, err)
        self._record(iteration, StepKind.LIMIT, self._failed(said, err))
        return _TurnEnded(Outcome.MODEL_ERROR, answer)

    def _model_failure(self, spec: str, err: ActivityError | ApplicationError) -> tuple[str, str]:
        """What a model that failed for good did, in words a customer may read (its kind
        and the model's name), and the turn's answer if the turn ends with it."""
        cause = _cause(err)
        model = spec or "the worker's default model"
        named = f"{model} failed ({fallback.reason(cause)})"
        if isinstance(cause, ApplicationError) and cause.type in _REFUSED:
            # `rewind.refused_model` reads this step: the model cannot be used at all.
            kind, answer = "model request rejected", answers.model_rejected()
        elif isinstance(cause, ApplicationError) and cause.type != ModelUnavailable.__name__:
            kind, answer = "model reply unusable", answers.model_unusable()
        else:
            kind, answer = "model unavailable", answers.model_failed(self._found())
        return f"{kind}: {named}", answer

    def _failed(self, said: str, err: Exception) -> str:
        """`said` (what the customer may read of a failure: its kind), after the error's
        own text went where only the operator reads it: the worker's log and the turn's
        span, credentials masked. Never into a step or an answer."""
        own = redact.mask(_failure(err))
        workflow.logger.warning("%s: %s", said, own)
        record_failure(self._span, said, own)
        return said

    def _unscreened(self, err: Exception) -> Verdict:
        """The shields could not run at all: fail closed. The model and the customer read
        that they could not; why (a shield's own error) is the operator's (`_failed`)."""
        said = self._failed("the shields could not run", err)
        return Verdict(shield="shields", allowed=False, category="shield_error", message=said)

    def _earlier_answers(self, turn: TurnInput) -> list[Source]:
        """What the model read that the customer did not write, besides the tool results
        (which parse reads from the conversation)."""
        return [Source(what="an earlier answer", text=e.answer) for e in turn.history]

    async def _parse(
        self, turn: TurnInput, iteration: int, calls: list[ToolCall], tools: list[str] | None
    ) -> ParseOutput:
        try:
            return await self._parse_once(turn, calls, tools)
        except (ActivityError, ApplicationError) as e:
            self._if_out_of_time()
            self._if_tools_lost(iteration, e)
            # Its shields could not run (one hung past the timeout, say): every call is
            # blocked, as the shields fail closed; the model reads that they could not.
            unscreened = self._unscreened(e)
            never_run = [ValidCall(call=c, timeout=PARSE_TIMEOUT, max_attempts=1) for c in calls]
            return ParseOutput(valid=never_run, rejected=[], verdicts=[[unscreened]] * len(calls))

    async def _parse_once(
        self, turn: TurnInput, calls: list[ToolCall], tools: list[str] | None
    ) -> ParseOutput:
        parsed = await _local(
            ParseActivity.parse,
            self._parse_input(turn, calls, tools, self._conversation_ref()),
            start_to_close_timeout=PARSE_TIMEOUT,
            schedule_to_close_timeout=self._within(),
            retry_policy=SHIELD_RETRY,
            summary=answers.markdown_safe(f"parse: {', '.join(c.name for c in calls)}"),
        )
        return parsed.restored(calls)

    def _parse_input(
        self,
        turn: TurnInput,
        calls: list[ToolCall],
        tools: list[str] | None,
        conversation: ConversationRef,
    ) -> ParseInput:
        """What parse reads besides the calls: the same whether the turn's parse activity
        or a model call (`_parse_ahead`, with the turn's tools) runs it."""
        return ParseInput(
            calls=calls,
            tools=tools,
            agent=self._agent.name,
            tools_version=self._agent.tools_version,
            tool_lists=self._agent.tool_lists,
            said=_said(turn),
            sources=self._earlier_answers(turn),
            conversation=conversation,
            customer_id=turn.customer_id,
            fork=turn.fork is not None,
            unasked=self._unasked,
        )

    def _reject(self, iteration: int, call: ToolCall, error: str) -> Observation:
        observation = Observation(call_id=call.id, tool=call.name, ok=False, text=error)
        self._record(
            iteration, StepKind.REJECTED, f"{call.name}: rejected: {error}", observation=observation
        )
        return observation

    async def _round(
        self,
        here: tuple[TurnInput, Reply, int, int, StepKind],
        valid: list[ValidCall],
        results: dict[str, Observation],
    ) -> list[Observation]:
        """The round's valid calls, run together; a call with its result already (in a
        round carried from the run before) is not run again. Once every call not done
        waits for a person, the turn may continue as new (`_due`): they go on waiting
        in the next run."""
        turn, _, iteration, _, _ = here
        open_ = {vc.call.id for vc in valid if vc.call.id not in results}

        async def one(index: int, vc: ValidCall) -> Observation:
            if vc.call.id in results:
                return results[vc.call.id]
            observation = await self._run_call(
                turn, iteration, index, vc, self._pending.get(vc.call.id)
            )
            results[vc.call.id] = observation
            open_.discard(vc.call.id)
            return observation

        def parked() -> bool:
            return all(c in self._pending and c not in self._decisions for c in open_)

        async def move_when_parked() -> None:
            await workflow.wait_condition(lambda: not open_ or (parked() and self._due()))
            if open_:
                raise await self._move(*here, round=(valid, results))

        *observations, _ = await _all(
            [*(one(i, vc) for i, vc in enumerate(valid)), move_when_parked()]
        )
        return observations

    def _due(self) -> bool:
        """Time to continue as new: the history nears Temporal's limits (Temporal says
        so, or it passed the turn's own thresholds), and this run has made a model
        call (so that every run makes progress)."""
        if not self._progressed:
            return False
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._limits.continue_after_events
            or info.get_current_history_size() >= self._limits.continue_after_bytes
        )

    async def _move(
        self,
        turn: TurnInput,
        reply: Reply,
        iteration: int,
        replans: int,
        source: StepKind,
        round: tuple[list[ValidCall], dict[str, Observation]] | None = None,
    ) -> _Continue:
        """Where the turn stands, for its next run (`round`: the round under way, its
        valid calls and the results so far). Every handler finishes first; a decision
        that comes meanwhile is carried, not acted on (`_moving`)."""
        self._moving = True
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        state = carried(self._stream.get_state(), STREAM_KEEP)
        # The round as it stands now (a wait may have run out meanwhile).
        under_way = None if round is None else CarriedRound(valid=round[0], done=round[1])
        carry = TurnCarry(
            run=self._run_number + 1,
            agent=self._agent,
            steps=self._steps,
            steps_before=self._steps_before + len(self._steps),
            usage=self._usage,
            model=self._model,
            tools_used=self._tools_used,
            tainted=self._tainted,
            status=self._status,
            model_calls=self._model_calls,
            sent=self._sent,
            consented=self._consented,
            budget_ok=self._budget_ok,
            unasked=self._unasked,
            may_sample={k: v for k, v in self._may_sample.items() if v is not None},
            started=self._started,
            paused=self._paused,
            paused_since=self._paused_since,
            iteration=iteration,
            replans=replans,
            source=source,
            reply=reply,
            round=under_way,
            models=self._models,
            instructions=self._instructions,
            pending=list(self._pending.values()),
            decisions=[d for c, d in self._decisions.items() if c in self._pending],
            stream=state,
            served=self._served if turn.fork is not None else None,
        )
        return _Continue(carry)

    def _found(self) -> list[Step]:
        """The steps an answer at a limit sums up (this run's, after the run before's)."""
        return [*self._earlier, *self._steps]

    async def _run_call(
        self,
        turn: TurnInput,
        iteration: int,
        index: int,
        vc: ValidCall,
        waiting: PendingApproval | None = None,
    ) -> Observation:
        """One call of the round; `waiting`: its consent, asked in the run before."""
        call = vc.call
        if turn.fork is not None:
            writes = vc.side_effects or vc.agent is not None  # a sub-agent may write
            recorded = rewind.match(turn.fork, call, writes=writes, served=self._served)
            if recorded is not None:
                return await self._from_record(turn, iteration, vc, turn.fork, recorded, writes)
        if waiting is not None:
            if refused := await self._consent(
                turn, iteration, call, waiting.why, waiting, waiting.approvers
            ):
                return refused
        elif refused := await self._checked_and_consented(turn, iteration, index, vc):
            return refused
        if vc.in_workflow:
            return await self._waited(turn, iteration, call)
        if vc.agent is not None:
            return await self._ask_subagent(turn, iteration, index, vc, vc.agent)
        self._record(
            iteration,
            StepKind.TOOL_CALL,
            call.render(),
            calls=[call],
            tool_schema=vc.tool_schema,
            consent=self._waived.pop(call.id, None),
        )
        size = vc.result_chars
        await self._room_for(size)
        try:
            dispatched = await self._send_asking(turn, iteration, index, vc)
            # Screened by dispatch itself, most often: else (its shields failed there)
            # by parse_output, which never runs the tool again.
            parsed = dispatched.parsed or await self._parse_output(turn, call, dispatched.data)
            self._screened_text(parsed)
            observation = parsed.observation
            stop = self._judged(iteration, "tool_output", call, parsed.verdicts)
            # Data, never instructions: whatever it says, writes from now on need consent.
            self._tainted = self._tainted or stop is not None
        except (ActivityError, ApplicationError, TimeoutError) as e:
            # A failing tool is something for the model to read, not a failed turn,
            # unless it was stopped because the turn's time was up, or this worker
            # cannot get the turn's tools.
            self._if_out_of_time()
            self._if_tools_lost(iteration, e)
            text = _failure_text(e, call, vc)
            observation = Observation(call_id=call.id, tool=call.name, ok=False, text=text)
        finally:
            self._in_flight -= size
        return self._observed(iteration, call, observation)

    def _observed(self, iteration: int, call: ToolCall, observation: Observation) -> Observation:
        """A call's result, as its step: the model reads it whole (its message), the
        story shows its start."""
        if call.name not in self._tools_used:
            self._tools_used.append(call.name)
        shown = observation.model_copy(update={"text": preview(observation.text)})
        self._record(
            iteration, StepKind.OBSERVATION, f"{call.name}: {shown.text}", observation=shown
        )
        return observation

    def _screened_text(self, parsed: ParseOutputOutput) -> None:
        """A result's text is in an activity's result (`dispatch`, `parse_output`): the
        model calls that carry it name it there (`_conversation`)."""
        if len(parsed.observation.text) >= BY_REFERENCE_CHARS:
            self._stored_texts.add(digest_of(parsed.observation.text))

    async def _parse_output(
        self, turn: TurnInput, call: ToolCall, result: Any, note: str = ""
    ) -> ParseOutputOutput:
        """A call's result as the model reads it, screened by the tool-output shields."""
        parsed: ParseOutputOutput = await _local(
            ParseOutputActivity.parse_output,
            ParseOutputInput(
                call=call,
                result=result,
                customer_id=turn.customer_id,
                agent=self._agent.name,
                tools_version=self._agent.tools_version,
                tool_lists=self._agent.tool_lists,
            ),
            start_to_close_timeout=SHIELD_TIMEOUT,
            schedule_to_close_timeout=self._within(),
            retry_policy=SHIELD_RETRY,
            summary=answers.markdown_safe(f"parse_output: {call.name}{note}"),
        )
        self._screened_text(parsed)
        return parsed

    async def _room_for(self, size: int) -> None:
        """Until a call whose result may be `size` characters can run: the results of
        the calls running at once, and their parse_output records, reach one workflow
        task together, which must stay within Temporal's message size. A call alone
        always runs; old turns' calls have no size, and never wait."""
        # A loop: every call waiting is woken by the same change, and those woken first
        # may have taken the room again.
        while self._in_flight and self._in_flight + size > MAX_RESULTS_IN_FLIGHT_CHARS:
            await workflow.wait_condition(
                lambda: not self._in_flight or self._in_flight + size <= MAX_RESULTS_IN_FLIGHT_CHARS
            )
        self._in_flight += size

    async def _checked_and_consented(
        self, turn: TurnInput, iteration: int, index: int, vc: ValidCall
    ) -> Observation | None:
        """None when the call may run; otherwise the result the model reads instead."""
        call = vc.call
        why = vc.approval
        if vc.side_effects and self._tainted:
            tainted = (
                "a tool result earlier in this turn carried instruction-like text, so every "
                "write after it needs consent"
            )
            why = f"{why}; {tainted}" if why else tainted
        if why and vc.checked:
            # Nobody is asked to approve what cannot happen; the approval says what will.
            change, refusal = await self._check(turn, iteration, index, vc)
            if refusal is not None:
                return refusal
            if change:
                why = f"{why}; it will: {change}"
        if why:
            return await self._consent(turn, iteration, call, why, approvers=vc.approvers)
        if vc.side_effects:
            self._ran_unasked(call)
            self._waived[call.id] = Consent(
                call_id=call.id,
                tool=call.name,
                call_hash=consent_hash(call),
                approved=True,
                by="",
                via=WAIVED,
                at=workflow.now(),
                reason="no one was asked: the agent's approval policy waives consent for it",
            )
        return None

    def _ran_unasked(self, call: ToolCall) -> None:
        """A waived write runs: parse found it repeats none of this turn's, and makes
        the next copy ask. Parse lets no more than `MAX_UNASKED_WRITES` through."""
        key = digest(call)
        if key not in self._unasked and len(self._unasked) < MAX_UNASKED_WRITES:
            self._unasked.append(key)

    async def _send_asking(
        self, turn: TurnInput, iteration: int, index: int, vc: ValidCall
    ) -> DispatchOutput:
        """The call's dispatch; when an MCP server asks the person a question during it,
        the person's answer (or `cancel` once the wait is up), then the call sent again
        with every answer so far, which the server's same question now gets."""
        given: list[Answer] = []
        sampled: list[sampling.Reply] = []
        while True:
            out = await self._send(turn, iteration, index, vc, given, sampled)
            if out.sampling is not None and out.question is None:
                if len(sampled) >= sampling.MAX_SAMPLES_PER_CALL:
                    raise ApplicationError(
                        f"{vc.call.name}: its server asked for the model more than "
                        f"{sampling.MAX_SAMPLES_PER_CALL} times in one call; it was not sent "
                        "again",
                        non_retryable=True,
                    )
                sampled.append(await self._sample(turn, iteration, vc.call, out.sampling))
                continue
            if out.question is None:
                return out
            if len(given) >= MAX_QUESTIONS_PER_CALL:
                raise ApplicationError(
                    f"{vc.call.name}: its server asked more than {MAX_QUESTIONS_PER_CALL} "
                    "questions in one call; it was not sent again",
                    non_retryable=True,
                )
            question = out.question.model_copy(
                update={"id": f"{vc.call.id}.q{len(given) + 1}", "call_id": vc.call.id}
            )
            given.append(await self._ask(iteration, vc.call, question))

    async def _sample(
        self, turn: TurnInput, iteration: int, call: ToolCall, request: sampling.Request
    ) -> sampling.Reply:
        """An MCP server's request for the agent's model: refused (one line the server
        gets) unless the server may sample (a person's consent once per server per turn,
        or `sampling: allow`) and the turn's caps leave room; else served by a model
        call of its own, recorded, counted and screened by the input and output
        shields as the turn's own question and answer are."""
        server = request.server
        said = f"{call.name}: MCP server {server} asks for the model"
        why = await self._sampling_refused(iteration, call, request)
        if why:
            self._record(iteration, StepKind.SAMPLE, f"{said}: refused: {why}")
            return sampling.Reply.refusal(request, why)
        asked = ShieldRequest(position="input", text=request.text, customer_id=turn.customer_id)
        (stop,), _ = await self._screen(turn, iteration, [asked])
        if stop is not None:
            why = f"blocked by the {stop.shield} shield ({stop.category})"
            self._record(iteration, StepKind.SAMPLE, f"{said}: refused: {why}")
            return sampling.Reply.refusal(request, why)
        budget = self._limits.max_tokens
        left = sampling.MAX_TOKENS if budget is None else budget - self._usage.total_tokens
        arg = SampleInput(
            model=turn.model,
            agent=self._agent.name,
            request=request,
            max_tokens=max(1, min(request.max_tokens, left)),
            settings=turn.settings,
            principal=turn.asker,
            budget_ok=self._budget_ok,
        )
        try:
            out = await self._model_call(
                turn, iteration, SampleActivity.sample, arg, f"sample for {server}", ends_turn=False
            )
        except _ModelFailed as failed:
            # The server's request fails, not the turn: the server reads one line, and
            # its call goes on (a request the model refuses need not end the turn).
            why = f"the agent's model failed ({failed.said})"
            self._record(iteration, StepKind.SAMPLE, f"{said}: refused: {why}")
            return sampling.Reply.refusal(request, why)
        self._usage += out.usage
        answered = ShieldRequest(
            position="output", text=out.text, context=[request.text], customer_id=turn.customer_id
        )
        (stop,), _ = await self._screen(turn, iteration, [answered])
        if stop is not None:
            why = f"the reply was blocked by the {stop.shield} shield ({stop.category})"
            self._record(iteration, StepKind.SAMPLE, f"{said}: refused: {why}")
            return sampling.Reply.refusal(request, why)
        tokens = out.usage.total_tokens
        self._record(iteration, StepKind.SAMPLE, f"{said}: {out.model} answered ({tokens} tokens)")
        return sampling.Reply.served(
            request, out.text, model=out.model, stop_reason=out.stop_reason
        )

    async def _sampling_refused(
        self, iteration: int, call: ToolCall, request: sampling.Request
    ) -> str:
        """Why the server's request is not served ("": it is): the turn is at a cap (no
        person is asked for what would be refused anyway), or the server may not sample
        (a person's consent, asked once per server per turn, was not given)."""
        budget = self._limits.max_tokens
        if budget is not None and self._usage.total_tokens >= budget:
            return f"the turn is at its token cap ({budget} tokens)"
        cap, spent = self._limits.max_cost, self._usage.cost_usd
        if cap is not None and (spent is None or spent >= cap):
            return f"the turn is at its cost cap (${cap})"
        server = request.server
        if request.policy == "allow":
            return ""
        if server not in self._may_sample:
            self._may_sample[server] = None
            question = Question(
                id=f"{call.id}.sampling",
                call_id=call.id,
                server=server,
                message=sampling.consent_message(request),
                requested_schema={"type": "object", "properties": {}},
                digest=request.digest,
            )
            answer = await self._ask(iteration, call, question)
            self._may_sample[server] = answer.action == "accept"
        else:  # another call of the round asks the same person already
            await workflow.wait_condition(lambda: self._may_sample[server] is not None)
        if not self._may_sample[server]:
            return f"no consent for {server!r} to use the agent's model in this turn"
        return ""

    async def _ask(self, iteration: int, call: ToolCall, question: Question) -> Answer:
        """Wait, durably and holding no worker slot, for a person's answer to `question`;
        past its timeout, `cancel`. The clock of max_duration stops meanwhile."""
        wait = (
            timedelta(seconds=question.timeout_s)
            if question.timeout_s is not None
            else self._limits.approval_timeout
        )
        self._clock_stops()  # a person is answering
        question = question.model_copy(update={"tool": call.name, "since": workflow.now()})
        self._questions[question.id] = question
        shown = f" ({question.url}, at {question.domain})" if question.mode == "url" else ""
        self._record(
            iteration,
            StepKind.QUESTION,
            f"{call.name}: MCP server {question.server} asks ({question.id}): "
            f"{question.message}{shown}",
            calls=[call],
        )
        self._publish_questions()
        self._set_status(search.AWAITING_APPROVAL)
        try:
            await workflow.wait_condition(
                lambda: question.id in self._answers,
                timeout=wait,
                timeout_summary=answers.markdown_safe(f"answer to {question.server}"),
            )
            answer = self._answers[question.id]
            said = f"{answer.action} by {answer.by}"
        except asyncio.TimeoutError:
            answer = Answer(digest=question.digest, action="cancel", by="timeout")
            said = f"cancel: no answer within {_duration(wait)}"
        del self._questions[question.id]
        self._publish_questions()
        self._clock_goes()
        self._set_status(self._waiting_on())
        self._record(iteration, StepKind.QUESTION, f"{call.name}: {question.id}: {said}")
        return answer

    def _publish_questions(self) -> None:
        """The questions awaiting an answer, in the memo: `pending` lists them while no
        worker runs (each bounded: `durable_agent.elicitation`)."""
        questions = [q.model_dump(mode="json") for q in self._questions.values()]
        workflow.upsert_memo({search.QUESTIONS_MEMO: questions})

    async def _send(
        self,
        turn: TurnInput,
        iteration: int,
        index: int,
        vc: ValidCall,
        given: list[Answer] | None = None,
        sampled: list[sampling.Reply] | None = None,
    ) -> DispatchOutput:
        """The call's dispatch. A write whose outcome came back unknown (it may have
        run; the system it went to takes no idempotency key) is sent again only if a
        person says so, once; declined, the model reads that it was not sent again."""
        sent = DispatchInput(
            call=vc.call,
            customer_id=turn.customer_id,
            idempotency_key=f"{workflow.info().workflow_id}/{iteration}/{index}",
            agent=self._agent.name,
            tools_version=self._agent.tools_version,
            tool_lists=self._agent.tool_lists,
            context=turn.context,
            answers=given or [],
            replies=sampled or [],
            followed=self._followed(turn),
            principal=turn.principal,
            consent=self._approved.pop(vc.call.id, ""),
            # The knowledge's search reads the turn's files too; no other tool is given them.
            documents=self._documents() if vc.call.name == SEARCH_TOOL else [],
        )
        try:
            return await self._dispatch(vc, sent)
        except ActivityError as e:
            if not (vc.side_effects and _outcome_unknown(e)):
                raise
            lost = _failure_text(e, vc.call, vc)
            why = f"it may have run already ({lost}); approve to send it again"
        if self._agent.unknown_outcomes == "model":
            # The agent leaves it to the model: told, not sent again.
            raise ApplicationError(
                f"{vc.call.name}: the outcome is unknown, it may have run already ({lost}); "
                "it was not sent again. Look it up before trying again, or tell the customer.",
                non_retryable=True,
            )
        self._decisions.pop(vc.call.id, None)  # the consent to send it once is spent
        refused = await self._consent(turn, iteration, vc.call, why, approvers=vc.approvers)
        if refused is not None:
            raise ApplicationError(
                f"{vc.call.name} was not sent again: {refused.text}", non_retryable=True
            )
        return await self._dispatch(vc, sent)

    def _followed(self, turn: TurnInput) -> int:
        """A replay in a world of its own: the recording's calls it was answered from the
        record, which that world applies before any call runs live in it."""
        return self._served.next if turn.fork is not None and turn.fork.own_world else 0

    async def _check(
        self, turn: TurnInput, iteration: int, index: int, vc: ValidCall
    ) -> tuple[str, Observation | None]:
        """The tool's check of a call that needs consent, as a local activity (a read):
        what the call will change, or the observation that it cannot succeed. A check
        that cannot run leaves the call to the person, as before there were checks."""
        call = vc.call
        try:
            checked = await _local(
                DispatchActivity.check,
                DispatchInput(
                    call=call,
                    customer_id=turn.customer_id,
                    idempotency_key=f"{workflow.info().workflow_id}/{iteration}/{index}",
                    agent=self._agent.name,
                    tools_version=self._agent.tools_version,
                    tool_lists=self._agent.tool_lists,
                    context=turn.context,
                    followed=self._followed(turn),
                    principal=turn.principal,
                ),
                start_to_close_timeout=QUICK_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                retry_policy=tool_retry(vc.max_attempts),
                summary=answers.markdown_safe(f"check: {call.render()}"),
            )
        except (ActivityError, ApplicationError, TimeoutError) as e:
            self._if_out_of_time()
            self._if_tools_lost(iteration, e)
            cause = _cause(e)
            if isinstance(cause, ApplicationError) and cause.non_retryable:
                observation = Observation(
                    call_id=call.id, tool=call.name, ok=False, text=cause.message
                )
                self._record(
                    iteration,
                    StepKind.OBSERVATION,
                    f"{call.name}: not asked, it cannot be done: {cause.message}",
                    observation=observation,
                )
                return "", observation
            return "", None
        return str(checked.result or ""), None

    async def _dispatch(self, vc: ValidCall, input: DispatchInput) -> DispatchOutput:
        """Run the call: a quick read as a local activity first, anything else (or a
        quick read that ran long) as a regular activity with the tool's own policy."""
        summary = answers.markdown_safe(("writes: " if vc.side_effects else "") + vc.call.render())
        if vc.quick:
            try:
                return await _local(
                    DispatchActivity.dispatch,
                    input,
                    start_to_close_timeout=min(vc.timeout, QUICK_TIMEOUT),
                    schedule_to_close_timeout=self._within(QUICK_TIMEOUT),
                    retry_policy=tool_retry(vc.max_attempts),
                    summary=summary,
                )
            except (ActivityError, ApplicationError, TimeoutError) as e:
                # A local activity's failure may arrive unwrapped (ApplicationError).
                if not isinstance(_cause(e), TimeoutError):
                    raise
        return await workflow.execute_activity_method(
            DispatchActivity.dispatch,
            input,
            start_to_close_timeout=vc.timeout,
            schedule_to_close_timeout=self._within(),
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            retry_policy=tool_retry(vc.max_attempts),
            summary=summary,
        )

    async def _ask_subagent(
        self, turn: TurnInput, iteration: int, index: int, vc: ValidCall, agent: SubAgent
    ) -> Observation:
        """An agent tool's call: the sub-agent's own turn, as a child workflow, with what
        is left of this turn's budget; its answer is the call's result."""
        call = vc.call
        child_id = f"{workflow.info().workflow_id}-{call.name}-{iteration}-{index}"
        line = f"{call.render()} → {child_id}"
        self._record(
            iteration,
            StepKind.TOOL_CALL,
            line,
            calls=[call],
            tool_schema=vc.tool_schema,
            consent=self._waived.pop(call.id, None),
        )
        limits = self._limits.model_copy(
            update={
                "max_steps": max(1, self._limits.max_steps - iteration + 1),
                "max_duration": max(self._time_left(), timedelta(seconds=1)),
                "max_tokens": None
                if self._limits.max_tokens is None
                else max(1, self._limits.max_tokens - self._usage.total_tokens),
                "max_cost": None
                if self._limits.max_cost is None
                else max(0.0, self._limits.max_cost - (self._usage.cost_usd or 0.0)),
            }
        )
        child = TurnInput(
            question=str(call.arguments.get("question", "")),
            customer_id=turn.customer_id,
            model=agent.model or turn.model,
            limits=limits,
            conversation_id=turn.conversation_id,
            # A served sub-agent by name; a turn recorded before agents had names
            # gave its sub-agent tools and instructions instead.
            agent=agent.agent or self._agent.name,
            tools=None if agent.agent else agent.tools,
            instructions="" if agent.agent else agent.instructions,
            # The child's question is the model's; its writes answer to the customer's words.
            said=_said(turn),
            context=turn.context if agent.shares_context else {},
            principal=turn.principal,  # a sub-agent acts for the same person
        )
        try:
            result: TurnOutput = await workflow.execute_child_workflow(
                AgentTurn.run,
                child,
                id=child_id,
                static_summary=answers.markdown_safe(f"{call.name}: {_clip(child.question)}"),
                task_timeout=WORKFLOW_TASK_TIMEOUT,
                search_attributes=search.within(
                    search.at_start(
                        child.customer_id,
                        child.model,
                        child.conversation_id,
                        agent=child.agent if _named() else None,
                        principal=child.principal,
                    ),
                    workflow.info().typed_search_attributes,
                )
                if _indexed()
                else None,
            )
            self._usage += result.usage
            ok, text = result.outcome is Outcome.ANSWERED, result.answer
        except ChildWorkflowError as e:
            ok, text = False, f"{call.name} could not answer: {e.cause or e}"
        observation = Observation(call_id=call.id, tool=call.name, ok=ok, text=text)
        if call.name not in self._tools_used:
            self._tools_used.append(call.name)
        self._record(
            iteration, StepKind.OBSERVATION, f"{call.name}: {text}", observation=observation
        )
        return observation

    def _time_left(self) -> timedelta:
        """What is left of max_duration (waits for a person do not count)."""
        if self._started is None:
            return self._limits.max_duration
        now = workflow.now()
        paused = self._paused + (now - self._paused_since if self._paused_since else timedelta(0))
        return self._limits.max_duration - (now - self._started - paused)

    def _within(self, timeout: timedelta | None = None) -> timedelta | None:
        """An activity's schedule-to-close timeout: `timeout`, or what is left of
        max_duration if that is less. No time left: the turn ends here."""
        if self._started is None:
            return timeout
        left = self._time_left()
        if left <= timedelta(0):
            raise self._out_of_time()
        return left if timeout is None else min(timeout, left)

    def _out_of_time(self) -> _TurnEnded:
        answer = answers.time_limit(self._limits.max_duration, self._found())
        return _TurnEnded(Outcome.TIME_LIMIT, answer)

    def _if_out_of_time(self) -> None:
        """After an activity failed: if it failed because the time was up, the turn ends."""
        if self._started is not None and self._time_left() <= timedelta(0):
            raise self._out_of_time()

    def _if_tools_lost(self, iteration: int, err: Exception) -> None:
        """After an activity failed: if its worker could not get the tools the turn
        started with (`ToolListUnavailable`: no copy of an MCP server's list, or a
        changed one), or a payload of the turn's record (`_if_record_lost`), the turn
        ends, saying so; no step can go on without them."""
        self._if_record_lost(iteration, err)
        cause = _cause(err)
        if isinstance(cause, ApplicationError) and cause.type == ToolListUnavailable.__name__:
            line = self._failed("tools: the tools this turn started with are not available", err)
            self._record(iteration, StepKind.LIMIT, line)
            raise _TurnEnded(Outcome.UNKNOWN_AGENT, answers.tools_unavailable())

    def _if_record_lost(self, iteration: int, err: Exception) -> None:
        """After an activity failed: if a payload of the turn's record could not be had
        (`PayloadUnavailable`: missing from the payload store, altered there, never
        stored), the turn ends, its step saying which payload and store. A payload the
        workflow itself cannot read ends the turn in the worker, before this code runs."""
        if (line := _unavailable(err)) is not None:
            self._record(iteration, StepKind.LIMIT, f"payload store: {line}")
            raise _TurnEnded(Outcome.PAYLOAD_UNAVAILABLE, answers.PAYLOAD_UNAVAILABLE)

    async def _consent(
        self,
        turn: TurnInput,
        iteration: int,
        call: ToolCall,
        why: str,
        waiting: PendingApproval | None = None,
        approvers: list[str] | None = None,
    ) -> Observation | None:
        """Wait, durably and holding no worker slot, for a person's decision on `call`.
        None when approved; otherwise the result the model reads instead. `waiting`:
        the turn's run before asked, and the wait goes on (for what is left of it).
        `approvers`: who may decide (`ApprovalPolicy.approvers`; none: anyone)."""
        wait = self._limits.approval_timeout
        # A decision covers the one wait it was given in: a call id the model uses again
        # later (another round, other arguments) is asked again, never let through by an
        # earlier approval; and the write's dispatch checks the approval's hash.
        if waiting is None:
            self._decisions.pop(call.id, None)
            self._clock_stops()  # a person is deciding
            self._pending[call.id] = PendingApproval(
                call=call,
                why=why,
                since=workflow.now(),
                approvers=approvers or [],
                call_hash=consent_hash(call),
            )
            self._record(
                iteration,
                StepKind.APPROVAL,
                f"{call.render()} awaits approval: {why}",
                calls=[call],
            )
        else:
            wait -= workflow.now() - waiting.since
        self._publish_pending()
        self._set_status(search.AWAITING_APPROVAL)
        decision: ApprovalDecision | None = self._decisions.get(call.id)
        try:
            if decision is None and wait > timedelta(0):
                # Not while the turn moves to its next run: the decision is carried there.
                await workflow.wait_condition(
                    lambda: call.id in self._decisions and not self._moving,
                    timeout=wait,
                    timeout_summary=answers.markdown_safe(f"approval of {call.name}"),
                )
                decision = self._decisions[call.id]
        except asyncio.TimeoutError:
            decision = None
        except asyncio.CancelledError:
            if not self._moving:  # moving, it is carried as it is
                self._no_longer_pending(call)
            raise
        # Not in a `finally`: a workflow evicted from the worker's cache unwinds its
        # coroutines outside the workflow's event loop, where nothing may be asked of it.
        pending = self._pending[call.id]
        self._no_longer_pending(call)
        self._decisions.pop(call.id, None)  # spent
        if decision is None:
            text = expired(call, _duration(wait))
            self._record(
                iteration, StepKind.DECISION, f"{call.name}: no decision in time", calls=[call]
            )
        elif decision.approved:
            consent = _consent_of(pending, decision)
            approved = f"{call.name}: approved by {decision.by}"
            self._record(iteration, StepKind.DECISION, approved, calls=[call], consent=consent)
            self._consented.append(call.id)
            self._approved[call.id] = consent.call_hash
            return None
        else:
            consent = _consent_of(pending, decision)
            text = declined(call, decision)
            because = f": {decision.reason}" if decision.reason else ""
            self._record(
                iteration,
                StepKind.DECISION,
                f"{call.name}: declined by {decision.by}{because}",
                calls=[call],
                consent=consent,
            )
        observation = Observation(call_id=call.id, tool=call.name, ok=False, text=text)
        self._record(
            iteration, StepKind.OBSERVATION, f"{call.name}: {text}", observation=observation
        )
        return observation

    def _answer(self, reply: Reply, results: dict[str, Observation]) -> None:
        """The model's message, then one result per call, in the order it made them
        (together within what one model call's input may carry)."""
        results = fit_round(results)
        self._messages.append(reply.message())
        self._messages.extend(ToolResult.of(results[c.id]) for c in reply.calls)

    def _record(self, iteration: int, kind: StepKind, text: str, **fields) -> None:  # type: ignore[no-untyped-def]
        step = Step(iteration=iteration, kind=kind, text=text, **fields)
        self._steps.append(step)
        self._events.publish(StepEvent(step=step).model_dump(mode="json"))
        self._story.append(answers.story([step]))
        workflow.set_current_details("\n".join(self._story))

    def _no_longer_pending(self, call: ToolCall) -> None:
        del self._pending[call.id]
        self._publish_pending()
        self._clock_goes()
        self._set_status(self._waiting_on())

    def _idle(self) -> bool:
        """No call waits: for consent, for an answer to a server's question, or on a
        wait (a timer or an event)."""
        return not (self._pending or self._questions or self._waits)

    def _waiting_on(self) -> str:
        """The turn's AgentStatus now: a person before a timer or an event."""
        if self._pending or self._questions:
            return search.AWAITING_APPROVAL
        return search.WAITING if self._waits else search.RUNNING

    def _clock_stops(self) -> None:
        """Before a call starts to wait (for a person, a timer or an event):
        max_duration's clock stands still while any does (its time is not the agent's
        work)."""
        if self._idle() and self._started is not None:
            self._paused_since = workflow.now()

    def _clock_goes(self) -> None:
        """Once no call waits any more, the clock goes on."""
        if self._idle() and self._paused_since is not None:
            self._paused += workflow.now() - self._paused_since
            self._paused_since = None

    async def _waited(self, turn: TurnInput, iteration: int, call: ToolCall) -> Observation:
        """A `wait` or `wait_for_event` call (`durable_agent.waits`): a durable timer in
        this workflow, no activity, so a waiting turn holds no worker. It ends when its
        time is up, when the event it waits for arrives (`event`), or when a person
        wakes the turn (`wake`); what ended it is the call's result, screened by the
        tool-output shields as any tool's result is, and a source a write may take a
        value from only with consent (parse reads every result as one)."""
        plan = waits.planned(call, workflow.now(), self._limits.max_wait)
        if isinstance(plan, str):  # more than max_wait, a time passed: the model reads why
            return self._reject(iteration, call, plan)
        self._record(iteration, StepKind.WAIT, plan.story, calls=[call])
        self._clock_stops()
        self._waits[call.id] = plan
        self._set_status(self._waiting_on())  # one awaiting a person says more
        with contextlib.suppress(asyncio.TimeoutError):
            await workflow.wait_condition(
                lambda: call.id in self._woken,
                timeout=plan.until - plan.since,
                timeout_summary=answers.markdown_safe(plan.story),
            )
        woken_by, event = self._woken.pop(call.id, (None, None))
        del self._waits[call.id]
        self._clock_goes()
        self._set_status(self._waiting_on())
        ended = waits.ended(plan, workflow.now(), event, woken_by)
        try:
            parsed = await self._parse_output(turn, call, ended)
        except (ActivityError, ApplicationError) as e:
            # The shields fail closed: what ended the wait (an event's data) is withheld.
            self._if_out_of_time()
            self._if_tools_lost(iteration, e)
            text = f"the wait ended, but {self._unscreened(e).message}: what ended it is withheld"
            failed = Observation(call_id=call.id, tool=call.name, ok=False, text=text)
            return self._observed(iteration, call, failed)
        stop = self._judged(iteration, "tool_output", call, parsed.verdicts)
        self._tainted = self._tainted or stop is not None  # data, never instructions
        return self._observed(iteration, call, parsed.observation)

    def _publish_pending(self) -> None:
        """The calls awaiting a decision, in the memo: `pending` lists them, and a
        decision can be taken, while no worker of the turn's version runs to answer."""
        pending = [for_memo(p) for p in self._pending.values()]
        workflow.upsert_memo({search.PENDING_MEMO: pending})

    def _set_status(self, status: str) -> None:
        if status != self._status and _indexed():
            self._status = status
            updates: list[SearchAttributeUpdate[Any]] = [search.STATUS.value_set(status)]
            workflow.upsert_search_attributes(updates + self._agent_attributes())

    def _agent_attributes(self) -> list[SearchAttributeUpdate[Any]]:
        """AgentName and AgentFingerprint, in an upsert the turn sends anyway."""
        if not (self._names_agent and self._agent.name):
            return []
        return [
            search.AGENT.value_set(self._agent.name),
            search.FINGERPRINT.value_set(self._agent.fingerprint),
        ]

    def _finish(
        self, outcome: Outcome, answer: str, output: Any = None, output_type: str = ""
    ) -> TurnOutput:
        if outcome is not Outcome.ANSWERED:
            found = self._found()
            last = found[-1].iteration if found else 1
            self._record(last, StepKind.LIMIT, f"{outcome.value}: {answer}")
        self._done = True
        usage = answers.markdown_safe(usage_line(self._usage))
        workflow.set_current_details("\n".join([*self._story, usage]))
        if _indexed():
            # One upsert for all of them, in the turn's last workflow task.
            updates: list[SearchAttributeUpdate[Any]] = [
                search.STATUS.value_set(search.DONE),
                search.OUTCOME.value_set(outcome.value),
                search.TOOLS.value_set(self._tools_used),
            ]
            if self._model and self._model != workflow.info().typed_search_attributes.get(
                search.MODEL
            ):
                updates.append(search.MODEL.value_set(self._model))
            workflow.upsert_search_attributes(updates + self._agent_attributes())
        return TurnOutput(
            answer=answer,
            outcome=outcome,
            steps=self._steps,
            usage=self._usage,
            agent=self._agent.name,
            fingerprint=self._agent.fingerprint,
            output=output,
            output_type=output_type,
            earlier_steps=self._steps_before,
            runs=self._run_number,
        )

    async def _forked(self, turn: TurnInput, fork: Fork) -> tuple[Reply, int, StepKind]:
        """A fork's start: the parent's steps and conversation before step `fork.step`,
        as recorded (nothing of them runs again); then this turn's model decides that
        step, as the parent's did. The reply, the step it is of, and its kind."""
        for step in fork.steps:
            self._record(
                step.iteration,
                step.kind,
                step.text,
                calls=step.calls,
                observation=step.observation,
            )
        self._messages = rewind.prefix(fork)
        if fork.current:
            # Its calls are matched against the record as the agent takes it now, in this
            # run and (carried in the input) the next.
            fork = turn.fork = await self._rechecked(turn, fork)
        if fork.live_reads:
            await self._reread(turn, fork)
        summary = f"fork of {fork.parent} from step {fork.step}"
        if fork.step == 1:
            return await self._plan(turn, 1, summary), 1, StepKind.PLAN
        reply = await self._interpret(turn, fork.step - 1, summary)
        # An answer belongs to the round it read, as in any turn.
        return reply, fork.step if reply.calls else fork.step - 1, StepKind.CONTINUE

    async def _rechecked(self, turn: TurnInput, fork: Fork) -> Fork:
        """A fork on the agent as served now: each call of its record whose tool was
        removed, or whose schema changed, gets a `changed` step (`rewind.changes`), at
        the fork's step. One its conversation holds that the agent cannot take now
        stops the fork, in one line: its model would go on from a call it cannot make.
        The fork, its record's calls as the agent takes them now."""
        if not fork.calls:
            return fork
        try:
            out = await _local(
                RecheckActivity.recheck,
                RecheckInput(
                    calls=[r.call for r in fork.calls],
                    tools=turn.tools,
                    agent=self._agent.name,
                    tools_version=self._agent.tools_version,
                    tool_lists=self._agent.tool_lists,
                ),
                start_to_close_timeout=RECHECK_TIMEOUT,
                schedule_to_close_timeout=self._within(),
                retry_policy=INSTRUCTIONS_RETRY,
                summary="recheck: the record's calls against the tools now",
            )
        except (ActivityError, ApplicationError) as e:
            self._if_out_of_time()
            self._if_tools_lost(fork.step, e)
            said = self._failed("its record could not be checked against the agent now", e)
            line = f"fork of {fork.parent} from step {fork.step}: {said}; fork it again"
            raise ApplicationError(line, type=CannotFork.__name__, non_retryable=True) from None
        changes = rewind.changes(fork, out.calls)
        for change in changes:
            self._record(fork.step, StepKind.CHANGED, change.line, calls=[change.recorded.call])
        if stop := next((c.stop for c in changes if c.stop), None):
            raise ApplicationError(stop, type=CannotFork.__name__, non_retryable=True)
        return rewind.as_taken_now(fork, out.calls)

    async def _from_record(
        self,
        turn: TurnInput,
        iteration: int,
        vc: ValidCall,
        fork: Fork,
        recorded: RecordedCall,
        writes: bool,
    ) -> Observation:
        """A fork's call the parent ran too: its recorded result, nothing run (a write
        is not done twice, so no one is asked to consent to it)."""
        call = vc.call
        line = rewind.served_line(fork, recorded, call, writes=writes)
        self._record(iteration, StepKind.RECORDED, line, calls=[call])
        if recorded.text is not None:
            observation = Observation(
                call_id=call.id, tool=call.name, ok=recorded.ok, text=recorded.text
            )
        else:  # a result the parent's model never read (return-direct): rendered here
            parsed = await self._parse_output(turn, call, recorded.result, " (recorded)")
            observation = parsed.observation
        if call.name not in self._tools_used:
            self._tools_used.append(call.name)
        shown = observation.model_copy(update={"text": preview(observation.text)})
        self._record(
            iteration, StepKind.OBSERVATION, f"{call.name}: {shown.text}", observation=shown
        )
        return observation

    async def _reread(self, turn: TurnInput, fork: Fork) -> None:
        """`live_reads`: the reads of the rounds before the fork's step run again, live,
        and their results take the recorded ones' places in the conversation (a step
        each, after the parent's); writes and sub-agents' calls keep their records."""
        steps = {r.call.id: r.step for r in fork.calls}
        for m in list(self._messages):
            if not isinstance(m, AssistantMessage) or not m.calls:
                continue
            parsed = await self._parse(turn, fork.step, m.calls, turn.tools)
            for index, vc in enumerate(parsed.valid):
                # A write, a sub-agent, a wait: its record stands.
                kept = vc.side_effects or vc.agent is not None or vc.in_workflow
                if kept or vc.call.id not in steps:
                    continue
                iteration = steps[vc.call.id]
                try:
                    dispatched = await self._send_asking(turn, iteration, index, vc)
                    parsed_output = dispatched.parsed or await self._parse_output(
                        turn, vc.call, dispatched.data
                    )
                    self._screened_text(parsed_output)
                    observation = parsed_output.observation
                except (ActivityError, ApplicationError, TimeoutError) as e:
                    self._if_out_of_time()
                    self._if_tools_lost(iteration, e)
                    text = _failure_text(e, vc.call, vc)
                    observation = Observation(
                        call_id=vc.call.id, tool=vc.call.name, ok=False, text=text
                    )
                self._messages = [
                    ToolResult.of(observation)
                    if isinstance(r, ToolResult) and r.call_id == vc.call.id
                    else r
                    for r in self._messages
                ]
                shown = preview(observation.text)
                self._record(
                    iteration,
                    StepKind.OBSERVATION,
                    f"{vc.call.name}: read again, live: {shown}",
                    observation=observation.model_copy(update={"text": shown}),
                )


_In = TypeVar("_In")
_Out = TypeVar("_Out")


async def _local(method: Callable[[Any, _In], Awaitable[_Out]], arg: _In, **options: Any) -> _Out:
    """Every local activity of the turn, its timeout failing one way whether it runs or
    is replayed: the SDK raises a local activity that timed out as `ActivityError` (its
    cause the `TimeoutError`) when it runs, but as the bare `TimeoutError` when a worker
    replays it from its marker (after a restart, or once the turn left the cache). Code
    that caught the first took another path in the replay: a non-determinism error, and
    the turn stuck. Here both are the `ActivityError`, as the turn first saw it."""
    try:
        return await workflow.execute_local_activity_method(method, arg, **options)
    except TimeoutError as e:
        raise ActivityError(
            "local activity timed out",
            scheduled_event_id=0,
            started_event_id=0,
            identity="",
            activity_type=getattr(method, "__name__", ""),
            activity_id="",
            retry_state=RetryState.TIMEOUT,
        ) from e


async def _all(calls: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """The round's calls, run together; if one ends the turn (its time is up), the
    others are cancelled with their activities."""
    tasks = [asyncio.create_task(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _outcome_unknown(e: ActivityError) -> bool:
    """The tool said its write may have happened (`durable_agent.errors.OutcomeUnknown`)."""
    return isinstance(e.cause, ApplicationError) and e.cause.type == "OutcomeUnknown"


def _covers(pending: PendingApproval, decision: ApprovalDecision) -> bool:
    """Whether a decision is on the call waiting: the hash of what the decider was shown
    (when given) is the waiting call's."""
    return not decision.call_hash or decision.call_hash == consent_hash(pending.call)


def _consent_of(pending: PendingApproval, decision: ApprovalDecision) -> Consent:
    """The record of a decision on the waiting call, as the turn takes it now."""
    return Consent(
        call_id=pending.call.id,
        tool=pending.call.name,
        call_hash=consent_hash(pending.call),
        approved=decision.approved,
        by=decision.by,
        principal=decision.principal,
        via=decision.via,
        at=workflow.now(),
        reason=decision.reason,
    )


def _indexed() -> bool:
    """Started with the agent's search attributes (so the namespace has them)."""
    return search.CUSTOMER in workflow.info().typed_search_attributes


def _said(turn: TurnInput) -> list[str]:
    """The customer's own words: this question and the conversation's earlier ones."""
    if turn.said is not None:
        return turn.said
    return [turn.question, *(e.question for e in turn.history)]


def _named() -> bool:
    """Started with AgentName too (on a namespace that has the agent's attributes)."""
    return search.AGENT in workflow.info().typed_search_attributes


def _duration(d: timedelta) -> str:
    seconds = d.total_seconds()
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _verdict_line(
    position: str, call: ToolCall | None, verdicts: list[Verdict], stop: Verdict | None
) -> str:
    what = position + (f" {call.render()}" if call else "")
    if stop is None:
        return f"{what}: allowed by {', '.join(v.shield for v in verdicts)}"
    return f"{what}: {stop.category} (the {stop.shield} shield): {stop.message}"


def _describe(reply: Reply) -> str:
    calls = ", ".join(c.render() for c in reply.calls)
    return f"{reply.text.strip()} → {calls}" if reply.text.strip() else calls


def _capped(limits: TurnLimits, cost_left: float | None) -> TurnLimits:
    """The turn's limits, with what is left of its conversation's spending cap."""
    if cost_left is None:
        return limits
    cap = cost_left if limits.max_cost is None else min(limits.max_cost, cost_left)
    return limits.model_copy(update={"max_cost": max(0.0, cap)})


def _failure(err: Exception) -> str:
    """An activity's failure in its own words."""
    cause = _cause(err)
    return cause.message if isinstance(cause, ApplicationError) else str(cause or err)


def _cause(err: Exception) -> BaseException | None:
    """What went wrong in an activity, however its failure arrived."""
    return err.cause if isinstance(err, ActivityError) else err


def _unavailable(err: BaseException | None) -> str | None:
    """The line of a `PayloadUnavailable` anywhere in an activity's failure (an activity
    whose arguments could not be read fails with it as the cause of the SDK's own)."""
    while err is not None:
        if isinstance(err, ApplicationError) and err.type == PayloadUnavailable.__name__:
            return err.message
        err = err.__cause__
    return None


def _failure_text(err: Exception, call: ToolCall, vc: ValidCall) -> str:
    cause = _cause(err)
    if isinstance(cause, TimeoutError):
        return (
            f"{call.name} timed out after {vc.timeout.total_seconds():g} s "
            f"({vc.max_attempts} attempt(s)); try again later."
        )
    # The model needs the tool's words; a credential in them is masked (the activity
    # masked it already, on a worker of this code).
    if isinstance(cause, ApplicationError):
        return redact.mask(cause.message)
    return redact.mask(str(cause or err))


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
