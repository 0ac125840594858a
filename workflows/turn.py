"""AgentTurn: one question, answered through tools, as one durable workflow.

    for each iteration (at most limits.max_steps):
        plan            model picks tool calls, or answers directly
        parse           validate the calls (local); rejected → re-plan, ≤ max_replans
        dispatch        run the valid calls concurrently, each with its own policy
        parse_output    each result → compact text (local)
        interpret       model: final answer, or continue with a next question
    the whole turn runs under a durable timer of limits.max_duration

Durability notes. This code is replayed from history after a crash, so it must
be deterministic: no I/O, no clocks, no randomness, only `workflow.*` APIs.
Activities that completed are never re-run; a local activity (parse,
parse_output) may run again if the worker dies before its result is recorded,
which is why both are pure. Every expected failure (a tool error, a model that
keeps failing, a cap) ends in a graceful answer; an unexpected exception fails
the workflow *task*, which Temporal retries after a fix is deployed.
"""

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from activities import (
        DispatchActivity,
        DispatchInput,
        InterpretActivity,
        InterpretInput,
        ParseActivity,
        ParseInput,
        ParseOutputInput,
        PlanActivity,
        PlanInput,
        ValidCall,
        parse_output,
    )
    from agent import answers
    from agent.model import Plan
    from agent.types import (
        Observation,
        Outcome,
        Step,
        StepKind,
        ToolCall,
        TurnInput,
        TurnOutput,
        TurnProgress,
        Usage,
    )
    from workflows.policies import (
        HEARTBEAT_TIMEOUT,
        MODEL_RETRY,
        MODEL_TIMEOUT,
        PURE_RETRY,
        PURE_TIMEOUT,
        tool_retry,
    )


class _TurnEnded(Exception):
    """Raised inside the loop to end the turn with an answer (model failure, etc.)."""

    def __init__(self, outcome: Outcome, answer: str) -> None:
        super().__init__(answer)
        self.outcome = outcome
        self.answer = answer


@workflow.defn(name="AgentTurn")
class AgentTurn:
    def __init__(self) -> None:
        self._steps: list[Step] = []
        self._usage = Usage()
        self._done = False

    @workflow.query
    def progress(self) -> TurnProgress:
        return TurnProgress(steps=self._steps, usage=self._usage, done=self._done)

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnOutput:
        loop = asyncio.create_task(self._loop(turn))
        try:
            await workflow.wait_condition(
                loop.done, timeout=turn.limits.max_duration, timeout_summary="max_duration"
            )
        except asyncio.TimeoutError:
            # Cancelling the loop cancels its in-flight activities; the answer uses
            # what the steps found so far.
            loop.cancel()
            answer = answers.time_limit(turn.limits.max_duration, self._steps)
            return self._finish(turn, Outcome.TIME_LIMIT, answer)
        try:
            return loop.result()
        except _TurnEnded as end:
            return self._finish(turn, end.outcome, end.answer)

    async def _loop(self, turn: TurnInput) -> TurnOutput:
        question = turn.question
        for iteration in range(1, turn.limits.max_steps + 1):
            plan, valid = await self._plan(turn, iteration, question)
            if not plan.calls:
                return self._finish(turn, Outcome.ANSWERED, plan.text, iteration)

            await asyncio.gather(
                *(self._run_call(turn, iteration, i, vc) for i, vc in enumerate(valid))
            )

            decision = (
                await self._model_call(
                    turn,
                    iteration,
                    InterpretActivity.interpret,
                    InterpretInput(model=turn.model, question=turn.question, steps=self._steps),
                    f"interpret: {_count_observations(self._steps, iteration)} observation(s)",
                )
            ).decision
            self._usage += decision.usage
            if decision.final:
                return self._finish(turn, Outcome.ANSWERED, decision.text, iteration)
            question = decision.text
            self._record(iteration, StepKind.CONTINUE, decision.text)

        answer = answers.step_limit(turn.limits.max_steps, self._steps)
        return self._finish(turn, Outcome.STEP_LIMIT, answer)

    async def _plan(
        self, turn: TurnInput, iteration: int, question: str
    ) -> tuple[Plan, list[ValidCall]]:
        """Plan, then validate; rejected calls go back to the model, at most max_replans times.

        Calls still invalid after that become failed observations for interpret.
        """
        attempt = 0
        while True:
            summary = f"plan: {_clip(question)}" if attempt == 0 else f"re-plan #{attempt}"
            plan = (
                await self._model_call(
                    turn,
                    iteration,
                    PlanActivity.plan,
                    PlanInput(model=turn.model, question=turn.question, steps=self._steps),
                    summary,
                )
            ).plan
            self._usage += plan.usage
            if not plan.calls:
                return plan, []
            self._record(iteration, StepKind.PLAN, _describe_plan(plan), calls=plan.calls)

            parsed = await workflow.execute_local_activity_method(
                ParseActivity.parse,
                ParseInput(calls=plan.calls),
                start_to_close_timeout=PURE_TIMEOUT,
                retry_policy=PURE_RETRY,
                summary=f"parse: {', '.join(c.name for c in plan.calls)}",
            )
            last_try = attempt == turn.limits.max_replans
            for r in parsed.rejected:
                kind = StepKind.OBSERVATION if last_try else StepKind.REJECTED
                self._record(
                    iteration,
                    kind,
                    f"{r.call.name}: rejected: {r.error}",
                    observation=Observation(
                        call_id=r.call.id, tool=r.call.name, ok=False, text=r.error
                    ),
                )
            if not parsed.rejected or last_try:
                return plan, parsed.valid
            attempt += 1

    async def _run_call(self, turn: TurnInput, iteration: int, index: int, vc: ValidCall) -> None:
        call = vc.call
        self._record(iteration, StepKind.TOOL_CALL, call.render(), calls=[call])
        try:
            dispatched = await workflow.execute_activity_method(
                DispatchActivity.dispatch,
                DispatchInput(
                    call=call,
                    customer_id=turn.customer_id,
                    idempotency_key=f"{workflow.info().workflow_id}/{iteration}/{index}",
                ),
                start_to_close_timeout=vc.timeout,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=tool_retry(vc.max_attempts),
                summary=("writes: " if vc.side_effects else "") + call.render(),
            )
            observation = (
                await workflow.execute_local_activity(
                    parse_output,
                    ParseOutputInput(call=call, result=dispatched.result),
                    start_to_close_timeout=PURE_TIMEOUT,
                    retry_policy=PURE_RETRY,
                    summary=f"parse_output: {call.name}",
                )
            ).observation
        except ActivityError as e:
            # A failing tool is something for the model to read, not a failed turn.
            text = _failure_text(e, call, vc)
            observation = Observation(call_id=call.id, tool=call.name, ok=False, text=text)
        self._record(
            iteration,
            StepKind.OBSERVATION,
            f"{call.name}: {observation.text}",
            observation=observation,
        )

    async def _model_call(self, turn: TurnInput, iteration: int, method, arg, summary: str):  # type: ignore[no-untyped-def]
        budget = turn.limits.max_tokens
        if budget is not None and self._usage.total_tokens >= budget:
            # Checked before a call, never after: an answer already paid for is kept.
            raise _TurnEnded(Outcome.TOKEN_LIMIT, answers.token_limit(budget, self._steps))
        try:
            return await workflow.execute_activity_method(
                method,
                arg,
                start_to_close_timeout=MODEL_TIMEOUT,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=MODEL_RETRY,
                summary=summary,
            )
        except ActivityError as e:
            cause = e.cause
            reason = cause.message if isinstance(cause, ApplicationError) else str(cause or e)
            self._record(iteration, StepKind.LIMIT, f"model failed: {reason}")
            raise _TurnEnded(Outcome.MODEL_ERROR, answers.model_failed(self._steps)) from e

    def _record(self, iteration: int, kind: StepKind, text: str, **fields) -> None:  # type: ignore[no-untyped-def]
        self._steps.append(Step(iteration=iteration, kind=kind, text=text, **fields))
        workflow.set_current_details(answers.story(self._steps))

    def _finish(
        self, turn: TurnInput, outcome: Outcome, answer: str, iteration: int | None = None
    ) -> TurnOutput:
        if outcome is Outcome.ANSWERED:
            self._record(iteration or 1, StepKind.ANSWER, answer)
        else:
            last = self._steps[-1].iteration if self._steps else 1
            self._record(last, StepKind.LIMIT, f"{outcome.value}: {answer}")
        self._done = True
        return TurnOutput(answer=answer, outcome=outcome, steps=self._steps, usage=self._usage)


def _describe_plan(plan: Plan) -> str:
    calls = ", ".join(c.render() for c in plan.calls)
    return f"{plan.text.strip()} → {calls}" if plan.text.strip() else calls


def _failure_text(err: ActivityError, call: ToolCall, vc: ValidCall) -> str:
    cause = err.cause
    if isinstance(cause, TimeoutError):
        return (
            f"{call.name} timed out after {vc.timeout.total_seconds():g} s "
            f"({vc.max_attempts} attempt(s)); try again later."
        )
    if isinstance(cause, ApplicationError):
        return cause.message
    return str(cause or err)


def _count_observations(steps: list[Step], iteration: int) -> int:
    return sum(s.iteration == iteration and s.kind is StepKind.OBSERVATION for s in steps)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
