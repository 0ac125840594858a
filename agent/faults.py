"""Fault injection for chaos runs: transient failures and latency on model and tool calls.

    AGENT_FAULTS="rate=0.3,latency=0.05,seed=7" python worker.py

`rate` is the chance that an attempt fails with a transient error
(`ModelUnavailable` / `ToolUnavailable`, which Temporal retries); `latency`
adds that many seconds to every call. The last attempt a retry policy allows
never fails on purpose, so injected faults are always transient: every turn
must still end with its normal answer, only later.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field


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
