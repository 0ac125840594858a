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
    AGENT_VERSIONING        on (default) | off: workers as versions of a deployment
    AGENT_DEPLOYMENT        the worker deployment (default: the task queue)
    AGENT_BUILD_ID          this worker's version (default: a hash of the code, the agents'
                            tools' code and the agents); one per release
    AGENT_PROMOTE           auto (default) | always | never: make this version current
                            (`durable_agent.runtime.deployments`)
    AGENT_WORKFLOW_SANDBOX  off (default) | on: run the turn and conversation workflows
                            inside the SDK's sandbox (`durable_agent.plugin`)
    AGENT_BUDGETS           spend caps per tenant or user, per UTC day or month, e.g.
                            tenant=20/day,user=2/day (read by `AgentPlugin`:
                            `durable_agent.budgets`)
    AGENT_STATE_DIR         what the commands keep on disk (`state_dir()`; default
                            .durable-agent/ in the current folder)

An agent's own `model`, `approvals` and `shields` take precedence over these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from durable_agent.approval import ApprovalPolicy
from durable_agent.shields import ShieldSettings

PROMOTE = ("auto", "always", "never")
"""What a starting worker does about its deployment's current version."""

STATE_DIR = ".durable-agent"
"""The folder, in the current one, where the commands keep what they write to disk."""

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
    versioning: bool = True
    """Each worker is a version of a worker deployment, and each turn finishes on the
    version it started on (`durable_agent.runtime.deployments`)."""
    deployment: str = ""
    """The worker deployment's name; empty: the task queue's."""
    build_id: str = ""
    """This worker's version; empty: a hash of the code, the agents' tools' code and the
    agents' fingerprints (`deployments.build_id`)."""
    promote: str = "auto"
    """`auto`: make this version current when the deployment has none; `always`; `never`."""
    workflow_sandbox: bool = False
    """Run `AgentTurn` and `Conversation` inside the SDK's workflow sandbox, as a guard
    while changing them; off, they run as plain code (a third less worker CPU per turn;
    the replay gate runs them in the sandbox either way). Other workflows a worker
    hosts keep the runner it was given."""

    def __post_init__(self) -> None:
        if self.promote not in PROMOTE:
            raise ValueError(f"AGENT_PROMOTE={self.promote!r}: use {', '.join(PROMOTE)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            task_queue=env.get("AGENT_TASK_QUEUE", "").strip() or DEFAULT_TASK_QUEUE,
            model=env.get("AGENT_MODEL", "").strip() or DEFAULT_MODEL,
            agents=tuple(a.strip() for a in env.get("AGENT_AGENTS", "").split(",") if a.strip()),
            approvals=ApprovalPolicy.from_env(env),
            shields=ShieldSettings.from_env(env),
            versioning=_switch("AGENT_VERSIONING", env.get("AGENT_VERSIONING", "on")),
            deployment=env.get("AGENT_DEPLOYMENT", "").strip(),
            build_id=env.get("AGENT_BUILD_ID", "").strip(),
            promote=env.get("AGENT_PROMOTE", "").strip().lower() or "auto",
            workflow_sandbox=_switch(
                "AGENT_WORKFLOW_SANDBOX", env.get("AGENT_WORKFLOW_SANDBOX", "off")
            ),
        )


def _switch(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{name}={raw!r}: use on or off")


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the commands keep their files: the embedded server's SQLite file, log and
    address (the commands run with this folder find that server there), the demo
    shop's data, the evals' records. AGENT_STATE_DIR, else `.durable-agent/` in
    the current folder (your project's, as `.git/` is), never inside the install."""
    env = os.environ if environ is None else environ
    return Path(env.get("AGENT_STATE_DIR", "").strip() or STATE_DIR).absolute()
