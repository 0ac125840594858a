"""Conversation: one chat with a customer, as one long-lived workflow.

    send (update)     a message → its own AgentTurn child workflow (`<chat id>-<n>`),
                      given the conversation's memory; answered in order, one at a time
    end (signal)      the customer is done
    upgrade (signal)  move to the deployment's current version now, if it changed
    state (query)     the memory, the turn in flight, how many turns so far
    idle_timeout      no message for this long ends the conversation
    continue-as-new   when Temporal suggests it (or after max_turns_per_run turns),
                      carrying the memory, so a long chat's history stays bounded
    versions          pinned, like its turns: a run never replays on code it did not
                      start on. When the deployment's current version changes, the
                      conversation continues as new onto it at the next turn boundary
                      (after a turn ends, or when a message or `upgrade` wakes it
                      while idle), carrying the memory, the waiting messages and the
                      stream: `durable_agent/runtime/deployments.py`

Each turn keeps its own history, five activity kinds and approvals; the
conversation only remembers questions and answers, bounded in count and size,
and hands them to the next turn as prior conversation. Messages are answered in
the order they came, one at a time: a message sent while another is being
answered waits its turn (its `send` returns when its turn starts, or, when the
conversation moves to new code first, when it is handed to the new run, whose
first act is to start it), so a client that sends as soon as it has seen an answer
never races the conversation. At most `MAX_WAITING` messages wait; more are
refused by the update's validator, which leaves no trace in the history.
"""

import asyncio
from typing import NoReturn

from temporalio import workflow
from temporalio.common import VersioningBehavior
from temporalio.contrib.workflow_streams import WorkflowStream
from temporalio.exceptions import ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from durable_agent import redact
    from durable_agent.answers import markdown_safe
    from durable_agent.chat import (
        ChatMessage,
        ConversationInput,
        ConversationOutput,
        ConversationState,
        MessageAccepted,
        WaitingMessage,
    )
    from durable_agent.stream import CHAT_TOPIC, ChatEnded, TurnAnswered, TurnStarted, carried
    from durable_agent.types import Exchange, Outcome, TurnInput, TurnOutput
    from durable_agent.workflows import search
    from durable_agent.workflows.policies import WORKFLOW_TASK_TIMEOUT
    from durable_agent.workflows.turn import AgentTurn

MAX_WAITING = 5
STREAM_KEEP = 200
"""Events of the conversation's stream carried over continue-as-new, within
`CARRIED_BYTES` (the rest are dropped: a reader that far behind starts again from
the oldest kept)."""


@workflow.defn(name="Conversation", versioning_behavior=VersioningBehavior.PINNED)
class Conversation:
    @workflow.init
    def __init__(self, input: ConversationInput) -> None:
        # State comes from the input here, not in `run`: the first message arrives
        # with the start (update-with-start), and its handler runs before `run` does.
        self._input = input
        self._exchanges: list[Exchange] = list(input.exchanges)
        self._turns = input.turns
        self._inbox: list[tuple[str, str]] = [(m.text, m.turn_id) for m in input.waiting]
        """(question, turn id) accepted by `send`, not yet started, in order."""
        self._files = {m.turn_id: m.attachments for m in input.waiting if m.attachments}
        """The attachments of those messages that have some, by turn id."""
        self._started: set[str] = set()
        self._current: str | None = None
        self._ended = input.ended
        self._spent = input.spent_usd
        """What its turns cost so far, against `input.max_cost`."""
        self._moving = False
        """Continuing as new: messages accepted from now on are handed to the next run."""
        # Which turn answers which message, for readers (`durable_agent/stream.py`).
        self._stream = WorkflowStream(input.stream_state)
        self._events = self._stream.topic(CHAT_TOPIC)

    @workflow.run
    async def run(self, input: ConversationInput) -> ConversationOutput:
        answered = 0
        while True:
            try:
                await workflow.wait_condition(
                    lambda: bool(self._inbox) or self._ended or _new_version(),
                    timeout=input.idle_timeout,
                    timeout_summary="idle_timeout",
                )
            except asyncio.TimeoutError:
                return await self._close("idle")
            if _new_version() and (self._inbox or not self._ended):
                # A turn boundary (a turn ended, or a message, a signal woke it while
                # idle): the next turn starts on the current version's code.
                await self._continue_as_new()
            if not self._inbox:
                return await self._close("customer")
            question, turn_id = self._inbox.pop(0)
            await self._answer(question, turn_id)
            answered += 1
            if not (self._inbox or self._ended) and (
                answered >= input.max_turns_per_run
                or workflow.info().is_continue_as_new_suggested()
            ):
                # A bounded history; when no message waits (as it always has been).
                await self._continue_as_new()

    async def _continue_as_new(self) -> NoReturn:
        """A new run, on the deployment's current version, with the memory, the
        messages still waiting (their `send` returns now: the new run starts their
        turns first) and the stream's recent events. Readers' polls are let go and
        retried on the new run; every handler finishes first."""
        self._moving = True
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        state = carried(self._stream.get_state(), STREAM_KEEP)
        workflow.continue_as_new(
            self._input.model_copy(
                update={
                    "exchanges": self._exchanges,
                    "turns": self._turns,
                    "stream_state": state,
                    "waiting": [
                        WaitingMessage(text=q, turn_id=t, attachments=self._files.get(t, []))
                        for q, t in self._inbox
                    ],
                    "ended": self._ended,
                    "spent_usd": self._spent,
                }
            ),
            # A pinned run would stay on its version; the next run starts on the
            # current one (the same one when nothing changed).
            initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
        )

    async def _answer(self, question: str, turn_id: str) -> None:
        files = self._files.pop(turn_id, [])
        turn = TurnInput(
            question=question,
            customer_id=self._input.customer_id,
            principal=self._input.principal,
            agent=self._input.agent,
            model=self._input.model,
            limits=self._input.limits,
            history=self._exchanges,
            conversation_id=workflow.info().workflow_id,
            stream=self._input.stream,
            context=self._input.context,
            settings=self._input.settings,
            attachments=files,
            cost_left=None
            if self._input.max_cost is None
            else max(0.0, self._input.max_cost - self._spent),
        )
        attributes = workflow.info().typed_search_attributes
        named = turn.agent if search.AGENT in attributes else None
        handle = await workflow.start_child_workflow(
            AgentTurn.run,
            turn,
            id=turn_id,
            search_attributes=search.within(
                search.at_start(
                    turn.customer_id,
                    turn.model,
                    turn.conversation_id,
                    agent=named,
                    principal=turn.principal,
                ),
                attributes,
            )
            if search.CUSTOMER in attributes
            else None,
            static_summary=markdown_safe(question[:200]),
            task_timeout=WORKFLOW_TASK_TIMEOUT,
        )
        self._current = turn_id
        self._started.add(turn_id)
        started = TurnStarted(turn_id=turn_id, question=question, files=[f.name for f in files])
        self._events.publish(started.model_dump())
        try:
            result: TurnOutput = await handle
            answer, outcome = result.answer, result.outcome
            self._spent += result.usage.cost_usd or 0.0
        except ChildWorkflowError as e:
            # A turn that failed (terminated, say) must not end the conversation. Why is
            # the operator's (the worker's log), never the customer's: it may hold a
            # host or a key.
            said = redact.mask(str(e.cause or e))
            workflow.logger.warning("turn %s ended without an answer: %s", turn_id, said)
            answer = "(no answer: the turn ended without one)"
            outcome = Outcome.MODEL_ERROR
        answered = TurnAnswered(turn_id=turn_id, outcome=outcome, answer=answer)
        self._events.publish(answered.model_dump(mode="json"))
        self._exchanges = self._input.memory.keep(
            [*self._exchanges, Exchange(question=question, answer=answer, attachments=files)]
        )
        self._current = None

    async def _close(self, ended_by: str) -> ConversationOutput:
        self._ended = True
        if search.CUSTOMER in workflow.info().typed_search_attributes:
            workflow.upsert_search_attributes([search.STATUS.value_set(search.DONE)])
        self._events.publish(ChatEnded(reason=ended_by).model_dump())
        self._stream.detach_pollers()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return ConversationOutput(turns=self._turns, ended_by=ended_by)

    @workflow.update
    async def send(self, message: ChatMessage) -> MessageAccepted:
        """Accept a message; returns once the turn that answers it has started, or
        once it is handed to the next run (`MessageAccepted.started` False)."""
        self._turns += 1
        turn, turn_id = self._turns, f"{workflow.info().workflow_id}-{self._turns}"
        self._inbox.append((message.text, turn_id))
        if message.attachments:
            self._files[turn_id] = message.attachments
        await workflow.wait_condition(lambda: turn_id in self._started or self._moving)
        return MessageAccepted(turn_id=turn_id, turn=turn, started=turn_id in self._started)

    @send.validator
    def _check_message(self, message: ChatMessage) -> None:
        if self._ended:
            raise ValueError("this conversation has ended; start a new one")
        if len(self._inbox) >= MAX_WAITING:
            raise ValueError(
                f"{len(self._inbox)} messages are already waiting for an answer; "
                "send this one when they have theirs"
            )

    @workflow.signal
    def end(self) -> None:
        """The customer is done: the conversation ends once the messages it already
        accepted have their answers."""
        self._ended = True

    @workflow.signal
    def upgrade(self) -> None:
        """Wakes the conversation, so that an idle one whose deployment has a new
        current version moves to it now rather than at its next message (its old
        version's workers are needed for that one step). Nothing else happens."""

    @workflow.query
    def state(self) -> ConversationState:
        return ConversationState(
            customer_id=self._input.customer_id,
            exchanges=self._exchanges,
            turns=self._turns,
            current_turn_id=self._current,
            ended=self._ended,
        )


def _new_version() -> bool:
    """The deployment's current version is no longer the one this run is pinned to
    (as of this workflow task: it is in the history, so replay sees the same)."""
    return workflow.info().is_target_worker_deployment_version_changed()


@workflow.defn(name="Conversation")
class UnversionedConversation(Conversation):
    """The same conversation for a worker that is no version of a deployment
    (`AGENT_VERSIONING=off`): Temporal refuses a versioning behavior from one."""

    @workflow.run
    async def run(self, input: ConversationInput) -> ConversationOutput:
        return await super().run(input)
