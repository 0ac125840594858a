"""Every timeout and retry policy of a turn, named for what it protects.

Permanent errors (unknown model, invalid model output, a tool's "not found": every
`AgentError` that is not `retryable`) are never retried: the activity marks them
non-retryable where they are raised (`activities._common.PermanentErrors`), so the
policies name no error types. Everything else (timeouts, throttling, dropped
connections) is retried with backoff.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

# A workflow task (one step of the turn's code, quick reads and checks included) is
# given this long before Temporal hands it to another worker; a worker killed while it
# holds one (SIGKILL, OOM, a lost node) leaves the turn waiting this long, so it bounds
# recovery (with HEARTBEAT_TIMEOUT and the worker's sticky-queue timeout, both 2 s).
# A task that overruns it is thrown away and run again: at 200 concurrent turns on one
# 2-core worker with two more processes spinning on its cores, none did
# (tests/test_load.py checks it), because a worker takes only as many tasks as it gets
# through (MAX_WORKFLOW_TASKS in durable_agent/plugin.py). The SDK's deadlock detector allows one
# activation 2 s too. A local activity running longer than 80 % of it (a slow remote
# shield) makes the SDK extend the task, at 3 history events each time.
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)

# Model calls (plan, interpret): slow, remote, throttled at times. The first retry
# comes after half a second, as the OpenAI SDK's own does: a call lost with a killed
# worker runs again 2.5 s after its last sign of life (HEARTBEAT_TIMEOUT and this),
# not 3 s (a Retry-After from the provider overrides the backoff, activities/_common.py).
MODEL_TIMEOUT = timedelta(seconds=60)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=20),
    maximum_attempts=5,
)

# An agent's instructions for one turn (`Agent(instructions=fn)`), evaluated once, before
# its first model call, as a local activity: a read of the agent's own (a profile, a
# plan), quick, retried a few times; then the turn ends, saying why. The prices a cost
# cap needs are a read of the worker's settings, under the same policy, and so is the
# recheck of a fork's record against the tools as served now (`rerun --current`).
INSTRUCTIONS_TIMEOUT = timedelta(seconds=10)
INSTRUCTIONS_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=2),
    maximum_attempts=3,
)
PRICES_TIMEOUT = timedelta(seconds=5)

# The retrieval step before a turn's loop (`Knowledge(retrieve=N)`): a local read of the
# worker's own index, refreshed first (a changed file is read again), so it may take a
# few seconds on a large edit; retried as the instructions are, then the turn goes on
# without it, saying so in its story.
RETRIEVE_TIMEOUT = timedelta(seconds=30)
RETRIEVE_RETRY = INSTRUCTIONS_RETRY
RECHECK_TIMEOUT = PRICES_TIMEOUT

# Remote calls heartbeat (see activities/_common.py): a dead worker's call is
# retried elsewhere after this, not after the whole start-to-close timeout.
HEARTBEAT_TIMEOUT = timedelta(seconds=2)


def tool_retry(max_attempts: int) -> RetryPolicy:
    """Tool calls: timeout and attempts are each tool's own (`@tool(timeout=, max_attempts=)`)."""
    return RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=max_attempts,
    )


# Quick reads (`@tool(quick=True)`) run as local activities with this much time in
# all, retries included; one that has not answered by then runs again as a regular
# activity under the tool's own timeout and retry policy.
QUICK_TIMEOUT = timedelta(seconds=2)


# Shields (and parse and parse_output, which run the tool-input and tool-output
# shields) run as local activities: quick checks, some of them remote (Bedrock
# Guardrails, Llama Guard), so a few retries with backoff; then the shield fails
# closed (activities/shield.py). A failure of parse or parse_output's own code is a
# bug: after those attempts the turn's task fails visibly.
SHIELD_TIMEOUT = timedelta(seconds=10)
PARSE_TIMEOUT = SHIELD_TIMEOUT
"""parse: validation (pure) and the tool-input shields."""
SHIELD_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
)
