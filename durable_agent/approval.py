"""Consent before side effects: which calls wait for a person, and the records of it.

A tool that changes something in the world (`@tool(side_effects=True)`) needs an
approval by default; a tool can also ask for one itself (`@tool(approval=True)`)
or waive it (`@tool(approval=False)`). The worker's settings have the last word:

    AGENT_APPROVAL_REQUIRED=order_status,search_policies   also these tools
    AGENT_APPROVAL_WAIVED=start_return                     not these (or `*`: none
                                                           at all, for trusted deployments)

An MCP server's tools are named as the agent offers them: `time__get_current_time`,
or `time__*` for every tool of the server whose prefix is `time` (a server whose tool
says it only reads, falsely, is put under consent so). A name under an MCP server's
prefix is taken even when the server does not list it now: its list may change.

A call that needs approval waits, durably, for a decision (the turn's `decide`
update) or for the approval timeout; a rejected or expired call becomes a
result the model reads, an approved one runs exactly once.

Who may decide is the agent's to say (`ApprovalPolicy(approvers={"refund":
"role:support-lead"})`): the person who asked, a role of their tenant, or either, by the
principals recorded (`durable_agent.Principal`); each decision is recorded with the
sha256 of the exact call it covers (`consent_hash`), which the write's dispatch checks
(docs/identity-and-consent.md).

A waiver covers one write, once: a waived write runs without asking once per turn
(the same tool with the same arguments again asks, `REPEATED`), and never in a fork of
a turn (`IN_A_FORK`), where it would be a real write that nobody asked for.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, field_validator

from durable_agent.principal import Principal
from durable_agent.types import ToolCall, compact_json

_ROLE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")

ALL = "*"
SEPARATOR = "__"
"""Between an MCP server's prefix and its tool's name (`durable_agent.mcp.SEPARATOR`)."""
EVERY_TOOL_OF = SEPARATOR + "*"
"""`server__*`: every tool of the MCP server whose tool names start `server__`."""

log = logging.getLogger("durable_agent.approval")


def _names(value: str) -> frozenset[str]:
    return frozenset(n.strip() for n in value.split(",") if n.strip())


WORKER_SETTINGS = "the worker's approval settings (AGENT_APPROVAL_REQUIRED / _WAIVED)"
AGENT_POLICY = "its approval policy (Agent(approvals=ApprovalPolicy(...)))"


ASKER = "asker"
"""An approver rule: the person who asked the turn (tenant and user, as recorded)."""
ROLE = "role:"
"""An approver rule `role:NAME`: anyone of the asker's tenant who has that role."""


@dataclass(frozen=True)
class ApprovalPolicy:
    """The worker's word on approvals, over what each tool declares; and who may decide.

    `approvers` names, per tool (by name, `*`, or an MCP server's `PREFIX__*`), who
    may decide on its calls: `asker`, `role:NAME` (of the asker's tenant), or several
    joined by `|` (`asker|role:support-lead`: either). A tool it does not name is
    decided by whoever can reach the turn, as before approvers existed. Decisions are
    compared by the principals recorded (`durable_agent.Principal`), never by name."""

    required: frozenset[str] = field(default_factory=frozenset)
    waived: frozenset[str] = field(default_factory=frozenset)
    approvers: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Left out of the hash (a dict has none): a policy stays hashable, as before."""

    def __post_init__(self) -> None:
        for tool, rule in self.approvers.items():
            rules(rule, tool)

    def approvers_of(self, tool: str) -> list[str]:
        """Who may decide on `tool`'s calls: its rules (its own name's first, then a
        server's `PREFIX__*`, then `*`); empty: anyone."""
        named = self.approvers.get(tool)
        if named is None:
            for name, rule in sorted(self.approvers.items(), key=lambda kv: kv[0] == ALL):
                if name != tool and _named(tool, frozenset({name})):
                    named = rule
                    break
        return rules(named, tool) if named else []

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApprovalPolicy:
        env = os.environ if environ is None else environ
        return cls(
            required=_names(env.get("AGENT_APPROVAL_REQUIRED", "")),
            waived=_names(env.get("AGENT_APPROVAL_WAIVED", "")),
        )

    def check(
        self, known: Iterable[str], source: str = WORKER_SETTINGS, prefixes: Iterable[str] = ()
    ) -> None:
        """Refuse a policy that names tools the agent does not have (a typo would
        silently leave a write unguarded, or guard nothing); `source` says whose
        policy it is. `prefixes` are the agent's MCP servers': a name under one
        (`time__now`, `time__*`) is taken, with a warning if no tool has it now."""
        known = set(known)
        servers = {p + SEPARATOR for p in prefixes}
        unknown: list[str] = []
        unlisted: list[str] = []
        for name in sorted((self.required | self.waived | set(self.approvers)) - known - {ALL}):
            prefix = name.removesuffix("*") if name.endswith(EVERY_TOOL_OF) else ""
            if prefix and prefix in servers:
                continue
            if any(name.startswith(p) for p in servers) and not name.endswith("*"):
                unlisted.append(name)
                continue
            unknown.append(name)
        if unknown:
            mcp_like = servers or any(SEPARATOR in n for n in unknown)
            mcp = "; an MCP server's as PREFIX__TOOL or PREFIX__*" if mcp_like else ""
            raise ValueError(
                f"{source} names unknown tools: {', '.join(unknown)} "
                f"(its tools: {', '.join(sorted(known)) or 'none'}{mcp})"
            )
        if unlisted:
            log.warning(
                "%s names %s, which no MCP server lists now (taken: a server's list may change)",
                source,
                ", ".join(unlisted),
            )

    def needs_approval(self, tool: str, declared: bool) -> bool:
        if _named(tool, self.required):
            return True
        if _named(tool, self.waived):
            return False
        return declared

    def outside(self, prefixes: Iterable[str]) -> ApprovalPolicy:
        """The policy without the names under these MCP servers' prefixes: what can be
        checked before the servers are connected."""
        servers = tuple(p + SEPARATOR for p in prefixes)

        def kept(names: frozenset[str]) -> frozenset[str]:
            return frozenset(n for n in names if not n.startswith(servers))

        return ApprovalPolicy(
            required=kept(self.required),
            waived=kept(self.waived),
            approvers={k: v for k, v in self.approvers.items() if k in kept(frozenset({k}))},
        )


def rules(rule: str, tool: str = "") -> list[str]:
    """`asker|role:support-lead` → `["asker", "role:support-lead"]`; ValueError, naming
    the tool, on anything else."""
    found = sorted({r.strip() for r in rule.split("|") if r.strip()})
    for r in found:
        role = r.removeprefix(ROLE)
        if r != ASKER and not (r.startswith(ROLE) and _ROLE.fullmatch(role)):
            raise ValueError(
                f"approvers of {tool or 'a tool'}: {r[:80]!r} is not `asker` or `role:NAME` "
                "(a-z 0-9 . _ -), joined by `|`"
            )
    if not found:
        raise ValueError(f"approvers of {tool or 'a tool'}: name `asker` or `role:NAME`")
    return found


def may_decide(approvers: list[str], asker: Principal, decider: Principal | None) -> str:
    """Why `decider` may not decide on a call the rules `approvers` cover, for a turn
    `asker` asked; empty when they may (no rules: anyone). Principals are compared
    whole: tenant and user, and a role only within the asker's tenant."""
    if not approvers:
        return ""
    if decider is not None:
        for rule in approvers:
            if rule == ASKER and decider.same_person(asker):
                return ""
            role = rule.removeprefix(ROLE)
            if rule.startswith(ROLE) and decider.tenant == asker.tenant and role in decider.roles:
                return ""
    wanted = " or ".join(
        "the person who asked"
        if r == ASKER
        else f"someone of tenant {asker.tenant!r} with role {r.removeprefix(ROLE)!r}"
        for r in approvers
    )
    who = decider.shown() if decider is not None else "a decider with no principal"
    return f"{who} may not decide on this call: {wanted} may"


def _named(tool: str, names: frozenset[str]) -> bool:
    """Whether a policy's names cover `tool`: by name, `*`, or `PREFIX__*` (every tool
    whose name starts `PREFIX__`: an MCP server's)."""
    if tool in names or ALL in names:
        return True
    return any(n.endswith(EVERY_TOOL_OF) and tool.startswith(n[:-1]) for n in names)


class ApprovalDecision(BaseModel):
    """Input of the turn's `decide` update."""

    call_id: str
    approved: bool
    by: str = Field(min_length=1, max_length=100)
    """Who decided (an operator's name, `customer`, ...), for the record."""
    reason: str = Field(default="", max_length=500)
    principal: Principal | None = None
    """Who decided, from the application's authentication (`durable_agent.Principal`):
    what an agent's approvers are checked against. None: only `by`, as before."""
    via: str = Field(default="", max_length=40)
    """The front end it came through (`cli`, `web`, `client`, an application's own)."""
    call_hash: str = Field(default="", max_length=64)
    """`consent_hash` of the call the decider was shown: a decision on any other call
    (its arguments changed since) is refused, and the write's dispatch checks it again."""

    @field_validator("by", "reason", "via")
    @classmethod
    def _one_line(cls, v: str) -> str:
        return " ".join(v.split())


class ApprovalResult(BaseModel):
    """Output of the `decide` update: what was recorded."""

    call_id: str
    approved: bool
    tool: str
    later: bool = False
    """Recorded while no worker of the turn's version ran: it applies when one runs
    the turn (a worker of that version, or the current one after a move)."""


def consent_hash(call: ToolCall) -> str:
    """SHA-256 of `canonical(call)` (tool name and arguments, every object's keys
    sorted), 64 hex digits: what an approval covers, and what a write's dispatch checks
    before it runs."""
    return hashlib.sha256(canonical(call).encode()).hexdigest()


def declined(call: ToolCall, decision: ApprovalDecision) -> str:
    """What the model reads for a call a person refused."""
    because = f": {decision.reason}" if decision.reason else ""
    return f"Not done: {call.render()} was declined by {decision.by}{because}. Nothing was changed."


def expired(call: ToolCall, waited: str) -> str:
    return (
        f"Not done: nobody approved {call.render()} within {waited}, so it was not run. "
        "Nothing was changed."
    )


IN_A_FORK = "a write in a fork that its record did not serve needs consent, whatever a waiver says"
"""Why a write of a fork (`client.py rerun` / `replay`) asks: one its record served
never runs, so one that runs is a real write (a further copy of a recorded one too)."""
SUBAGENT_IN_A_FORK = (
    "a sub-agent's turn may write, and in a fork one that its record did not serve "
    "needs consent, whatever a waiver says"
)
REPEATED = (
    "the same write (same tool, same arguments) already ran in this turn without asking: "
    "each further copy needs consent"
)
MAX_UNASKED_WRITES = 1_000
"""The different writes a turn remembers having run without asking; past them, every
write asks (`too_many_unasked`): the memory is carried from run to run, so it is bounded."""


def too_many_unasked(limit: int) -> str:
    return (
        f"this turn already ran {limit:,} different writes without asking: "
        "each further one needs consent"
    )


def canonical(call: ToolCall) -> str:
    """A call as its repeats are compared: its tool and its arguments as JSON, every
    object's keys sorted (so `{"a": 1, "b": 2}` is `{"b": 2, "a": 1}`). A fork compares
    its calls with its record's so too (`durable_agent/rewind.py`)."""
    return compact_json([call.name, _sorted(call.arguments)])


def digest(call: ToolCall) -> str:
    """`canonical`, hashed: what a turn keeps of a write it ran without asking (bounded,
    whatever the arguments' size). Two different writes with one digest would only make
    the second ask."""
    return hashlib.sha256(canonical(call).encode()).hexdigest()[:32]


def _sorted(value: object) -> object:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value
