"""A worker's settings, as one typed object; the environment is one way to fill it.

    Settings()                                 the defaults
    Settings.from_env()                        AGENT_* variables (below)
    Settings(model="openai:gpt-4o", approvals=ApprovalPolicy(waived=frozenset({"refund"})))

    AGENT_TASK_QUEUE        task queue served (default agent-turns)
    AGENT_MODEL             model spec of turns that name none (default offline)
    AGENT_AGENTS            agents served, `module:attribute` comma-separated
                            (default: the demo shop's)
    AGENT_APPROVAL_REQUIRED / AGENT_APPROVAL_WAIVED    consent, over the tools' own word
    AGENT_SHIELDS_INPUT / _TOOL_INPUT / _TOOL_OUTPUT / _OUTPUT, AGENT_SHIELDS_FAIL_OPEN

An agent's own `model`, `approvals` and `shields` take precedence over these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from durable_agent.approval import ApprovalPolicy
from durable_agent.shields import ShieldSettings

DEFAULT_TASK_QUEUE = "agent-turns"
DEFAULT_MODEL = "offline"


@dataclass(frozen=True)
class Settings:
    task_queue: str = DEFAULT_TASK_QUEUE
    model: str = DEFAULT_MODEL
    """The spec of turns that name no model, of agents that name none."""
    agents: tuple[str, ...] = ()
    """`module:attribute` of each agent `worker.py` serves (empty: the demo shop's)."""
    approvals: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    shields: ShieldSettings = field(default_factory=ShieldSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            task_queue=env.get("AGENT_TASK_QUEUE", "").strip() or DEFAULT_TASK_QUEUE,
            model=env.get("AGENT_MODEL", "").strip() or DEFAULT_MODEL,
            agents=tuple(a.strip() for a in env.get("AGENT_AGENTS", "").split(",") if a.strip()),
            approvals=ApprovalPolicy.from_env(env),
            shields=ShieldSettings.from_env(env),
        )
