"""The worker's activity interceptor of `durable_agent.telemetry`: apart, so the client
side, which traces too, never imports `temporalio.worker`."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from durable_agent import telemetry

__all__ = ["ActivityAttempts"]


class ActivityAttempts(Interceptor):
    """Puts the attempt number on each activity attempt's span (Temporal's
    `RunActivity:<type>`) and `error.type` on a failed one. A worker interceptor:
    it runs inside the plugin's span, which the client's plugin opens first."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _AttemptInbound(next)


class _AttemptInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        span = trace.get_current_span()
        telemetry.note_attempt(span)
        span.set_attribute("temporal.activity.attempt", activity.info().attempt)
        try:
            return await super().execute_activity(input)
        except BaseException as e:
            span.set_attribute("error.type", telemetry.error_type(e))
            raise
