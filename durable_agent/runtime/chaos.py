"""Fault injection for chaos runs: transient failures and latency on model and tool calls.

    AGENT_FAULTS="rate=0.3,latency=0.05,seed=7" python worker.py

A worker interceptor wraps every activity, so no activity knows about it and
production code paths carry no chaos hooks; without `AGENT_FAULTS` the worker
does not install it at all.

`rate` is the chance that an attempt fails with a transient error
(`ModelUnavailable` / `ToolUnavailable`, which Temporal retries); `latency`
adds that many seconds to every call. The last attempt a retry policy allows
never fails on purpose, so injected faults are always transient: every turn
must still end with its normal answer, only later.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from durable_agent.errors import ModelUnavailable, ToolUnavailable

MODEL_ACTIVITIES = frozenset({"plan", "interpret"})
TOOL_ACTIVITIES = frozenset({"dispatch"})


@dataclass
class Faults:
    rate: float = 0.0
    latency: float = 0.0
    seed: int | None = None
    injected: int = field(default=0, init=False)
    """How many failures were injected so far."""
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate < 1.0:
            raise ValueError(f"fault rate must be in [0, 1), got {self.rate}")
        if self.latency < 0:
            raise ValueError(f"fault latency must be >= 0 s, got {self.latency}")
        self._random = random.Random(self.seed)

    @property
    def active(self) -> bool:
        return self.rate > 0 or self.latency > 0

    def should_fail(self, last_attempt: bool) -> bool:
        fail = not last_attempt and self.rate > 0 and self._random.random() < self.rate
        self.injected += fail
        return fail

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """`rate=0.3,latency=0.05,seed=7` (every part optional)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in ("rate", "latency", "seed"):
                raise ValueError(
                    f"bad AGENT_FAULTS part {part!r}: use rate=0.3,latency=0.05,seed=7"
                )
            values[key] = float(value)
        seed = values.pop("seed", None)
        return cls(**values, seed=None if seed is None else int(seed))

    @classmethod
    def from_env(cls) -> Faults:
        return cls.parse(os.environ.get("AGENT_FAULTS", ""))


class ChaosInterceptor(Interceptor):
    """Injects `faults` into model calls (`ModelUnavailable`) and tool calls
    (`ToolUnavailable`): the errors real backends raise when they are down, which
    the retry policies retry. Pure steps (parse, parse_output) are left alone."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inject(next, self.faults)


class _Inject(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, faults: Faults) -> None:
        super().__init__(next)
        self._faults = faults

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        kind = info.activity_type
        if kind in MODEL_ACTIVITIES or kind in TOOL_ACTIVITIES:
            if self._faults.latency:
                await asyncio.sleep(self._faults.latency)
            limit = info.retry_policy.maximum_attempts if info.retry_policy else 0
            if self._faults.should_fail(last_attempt=0 < limit <= info.attempt):
                error = ModelUnavailable if kind in MODEL_ACTIVITIES else ToolUnavailable
                raise error(f"injected fault in {kind} (attempt {info.attempt})")
        return await super().execute_activity(input)
