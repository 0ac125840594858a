"""Agents as a worker serves them: each definition resolved once, found by name.

    agents = Agents([bookstore, support], settings=Settings.from_env(), models=catalog)
    served = agents.get("bookstore")        # "" is the first one; else UnknownAgent
    served.tools, served.shields, served.approvals, served.instructions, served.deps

A turn names its agent; every activity of the turn resolves it here, so nothing of an
agent's code travels in a workflow's payloads, and two agents on one worker never see
each other's tools. `load(["mypkg.agents:bookstore"])` reads definitions the way
`worker.py --agent` does. Everything that can be wrong with a definition is found when
the worker starts (`AgentDefinitionError`, one line saying what to fix), not when a turn
first meets it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.metadata
import logging
import os
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from durable_agent import fallback
from durable_agent.agents import Agent
from durable_agent.approval import AGENT_POLICY, WORKER_SETTINGS, ApprovalPolicy
from durable_agent.argfill import id_noun, required_params
from durable_agent.errors import AgentDefinitionError, UnknownAgent
from durable_agent.model import ModelCatalog
from durable_agent.outputs import OUTPUT_TOOL, Output
from durable_agent.runtime.tool_lists import ToolListStore
from durable_agent.settings import Settings
from durable_agent.shields import Ids, ShieldConfigError, ShieldSet
from durable_agent.subagents import view_name
from durable_agent.tools import NotATool, ToolRegistry
from durable_agent.types import TurnLimits

log = logging.getLogger("durable_agent.serving")

MAX_TOOL_VERSIONS = 64
"""Earlier tool lists a worker keeps for the turns still running on them."""


class _Deps:
    """An agent's tool dependencies: given, or opened once per worker."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.value: Any = None if callable(source) else source
        self.opened = not callable(source)

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        if self.opened:
            return
        made = self.source()
        if hasattr(made, "__aenter__"):
            made = await stack.enter_async_context(made)
        elif hasattr(made, "__enter__"):
            made = stack.enter_context(made)
        self.value, self.opened = made, True


class ServedAgent:
    """One agent, ready for its turns' activities."""

    def __init__(
        self,
        agent: Agent,
        *,
        name: str = "",
        tools: ToolRegistry | None = None,
        instructions: str = "",
        settings: Settings,
        models: ModelCatalog,
        deps: _Deps,
        environ: dict[str, str] | None = None,
        tool_lists: ToolListStore | None = None,
    ) -> None:
        self.agent = agent
        self.name = name or agent.name
        self.tools = tools if tools is not None else _registry(agent)
        self.dynamic = None if instructions else agent.dynamic_instructions
        """The function that gives each turn its instructions (`Agent.instructions`)."""
        self.instructions = instructions or ("" if self.dynamic else agent.system_prompt)
        """The instructions of every turn; empty when each turn's are evaluated."""
        self._identity = instructions or agent.system_prompt
        self.approvals: ApprovalPolicy = agent.approvals or settings.approvals
        try:
            self.approvals.check(
                self.tools.tools,
                AGENT_POLICY if agent.approvals else WORKER_SETTINGS,
                getattr(self.tools, "prefixes", ()),  # its MCP servers' (`mcp.LiveTools`)
            )
        except ValueError as e:
            raise AgentDefinitionError(f"agent {self.name!r}: {e}") from None
        self.ids = ids_of(self.tools)
        try:
            self.shields = ShieldSet.build(agent.shields or settings.shields, self.ids, environ)
        except ShieldConfigError as e:
            raise AgentDefinitionError(f"agent {self.name!r}: {e}") from None
        self.model_specs = agent.model_specs or fallback.specs(models.default)
        """Its turns' models, in order, when a turn names none (fallback: the next gets a
        request the one before failed for good)."""
        default = self.model_specs[0] if self.model_specs else models.default
        self.models = models.layered(agent.model_factories, default)
        self.limits: TurnLimits = agent.limits
        self.unknown_outcomes = agent.unknown_outcomes
        self.model_calls = agent.model_calls
        self.refusals = agent.refusals
        self.sources = agent.context_sources if tools is None else []
        """What it knows besides its tools (`Agent.knowledge`); a view of it, nothing."""
        self.retrieve = sum(source.retrieve for source in self.sources)
        """How many passages its turns' retrieval step gives the model (0: no step)."""
        self.output = Output.of_type(agent.output_type) if agent.output_type is not None else None
        """The agent's output type, as its turns' values are checked (None: text)."""
        if OUTPUT_TOOL in self.tools:
            raise AgentDefinitionError(
                f"agent {self.name!r}: tool name {OUTPUT_TOOL!r} is the output tool's "
                "(typed outputs); rename the tool (@tool(name=...))"
            )
        self.question_refusal = agent.question_refusal
        self._deps = deps
        self.fingerprint = (
            agent.fingerprint() if tools is None else _view_fingerprint(self._identity, tools)
        )
        self._versions: OrderedDict[str, ToolRegistry] = OrderedDict()
        """Earlier tool lists of a live agent (MCP servers), by fingerprint."""
        self.tool_lists = tool_lists or ToolListStore.from_env(environ)
        """Where the MCP servers' lists are kept by hash, for the other workers."""

    def fingerprint_with(self, instructions: str, tools: ToolRegistry) -> str:
        """The fingerprint of a turn that got `instructions` (evaluated for it) and
        `tools`: what its model was given."""
        return _view_fingerprint(instructions, tools)

    def result_limit(self, tool: str, tools: ToolRegistry | None = None) -> int:
        """How much of one result of `tool` the model reads: the tool's own limit, else
        the agent's (`Agent.max_result_chars`)."""
        found = (tools or self.tools).tools.get(tool)
        own = found.max_result_chars if found is not None else None
        return own or self.agent.max_result_chars

    @property
    def live(self) -> bool:
        """Whether its tools may change while the worker runs (an MCP server's list):
        then each turn is pinned to the version it started with."""
        return hasattr(self.tools, "refresh")

    async def refresh_tools(self) -> None:
        """Between turns: take the servers' current tool lists, if they changed. The
        version a running turn started with stays at hand (`tools_at`)."""
        refresh = getattr(self.tools, "refresh", None)
        newer = await refresh() if refresh is not None else None
        if newer is None:
            return
        self._versions[self.fingerprint] = self.tools
        while len(self._versions) > MAX_TOOL_VERSIONS:
            self._versions.popitem(last=False)
        self.tools = newer
        self.fingerprint = _view_fingerprint(self._identity, newer)
        log.info(
            "agent %s: its MCP servers' tools changed (version %s)", self.name, self.fingerprint
        )

    def knows(self, version: str) -> bool:
        """Whether this worker has the tools of version `version` at hand."""
        return not version or version == self.fingerprint or version in self._versions

    def recorded_tools(self) -> dict[str, list[dict[str, Any]]]:
        """What each MCP server listed for the current version of the tools, by server.
        Empty: the agent's tools never change under a worker."""
        recorded = getattr(self.tools, "recorded", None)
        return recorded() if recorded is not None else {}

    def list_hashes(self) -> dict[str, str]:
        """What a turn records of the tools it is offered (`AgentInfo.tool_lists`): the
        hash of each MCP server's list, by server (`runtime/tool_lists.py`)."""
        hashes = getattr(self.tools, "hashes", None)
        return hashes() if hashes is not None else {}

    async def keep_lists(self) -> None:
        """The current version's lists in the tool-list store (once each), so that a
        worker that did not list them can serve a turn that records them. The version
        is the one current when it is called, whatever changes while it writes."""
        recorded, hashes = self.recorded_tools(), self.list_hashes()
        for server, digest in hashes.items():
            await self.tool_lists.keep(digest, recorded[server])

    def listed_as(self, digest: str) -> list[dict[str, Any]] | None:
        """A list this worker listed itself (for the current version or one it keeps)
        whose hash is `digest`; None if none is."""
        for tools in [self.tools, *reversed(self._versions.values())]:
            hashes = getattr(tools, "hashes", None)
            for server, found in (hashes() if hashes is not None else {}).items():
                if found == digest:
                    listed: list[dict[str, Any]] = tools.recorded()[server]  # type: ignore[attr-defined]
                    return listed
        return None

    def recall(self, version: str, recorded: Mapping[str, Any]) -> ToolRegistry | None:
        """The tools of a version this worker never saw, from the lists the turn
        recorded (each MCP server's, by server), through this worker's own connections;
        kept with the versions it saw. None if they cannot be made here, or are another
        version."""
        recall = getattr(self.tools, "recall", None)
        tools = recall(recorded) if recall is not None else None
        if tools is None or _view_fingerprint(self._identity, tools) != version:
            return None
        self._versions[version] = tools
        while len(self._versions) > MAX_TOOL_VERSIONS:
            self._versions.popitem(last=False)
        log.info("agent %s: serving tools version %s as its turn recorded it", self.name, version)
        return tools

    def tools_at(self, version: str) -> ToolRegistry:
        """The tools of version `version` (a turn's, from its first step; empty: now)."""
        if not version or version == self.fingerprint:
            return self.tools
        found = self._versions.get(version)
        if found is None:
            # A turn recorded before lists were kept by hash, whose record this worker
            # could not read (`activities/_tools.py`): it serves what the servers
            # offer now.
            log.warning(
                "agent %s: tools version %s is not known to this worker; serving %s",
                self.name,
                version,
                self.fingerprint,
            )
            return self.tools
        return found

    @property
    def deps(self) -> Any:
        if not self._deps.opened:
            raise RuntimeError(
                f"agent {self.name!r}: its deps are opened when the worker runs "
                "(AgentPlugin's run context); run the worker, then its activities"
            )
        return self._deps.value


class Agents:
    """The agents one worker serves (with every agent reachable as a tool), by name."""

    def __init__(
        self,
        agents: Sequence[Agent],
        *,
        settings: Settings | None = None,
        models: ModelCatalog | None = None,
        environ: dict[str, str] | None = None,
        tool_lists: ToolListStore | None = None,
    ) -> None:
        if not agents:
            raise AgentDefinitionError("no agent to serve: give at least one")
        self.tool_lists = tool_lists or ToolListStore.from_env(environ)
        """Where the agents' MCP tool lists are kept by hash (`runtime/tool_lists.py`):
        as AGENT_PAYLOAD_STORE says, else the state folder."""
        settings = settings or Settings()
        models = models or ModelCatalog({}, default=settings.model)
        self._deps: list[_Deps] = []
        self.served: dict[str, ServedAgent] = {}
        by_name: dict[str, Agent] = {}
        for agent in subagents_of(agents):
            if agent.name in by_name:
                raise AgentDefinitionError(
                    f"two agents are named {agent.name!r}; give each agent a name of its own"
                )
            by_name[agent.name] = agent
            if agent.mcp_servers:
                raise AgentDefinitionError(
                    f"agent {agent.name!r} names MCP servers: serve it as "
                    "`async with durable_agent.mcp.connected(agents) as agents:` gives it, "
                    "connected (worker.py does this)"
                )
            deps = _Deps(agent.deps)
            self._deps.append(deps)
            served = ServedAgent(
                agent,
                settings=settings,
                models=models,
                deps=deps,
                environ=environ,
                tool_lists=self.tool_lists,
            )
            self._add(served)
            for tool in served.tools.tools.values():
                sub = tool.agent
                if sub is None or sub.agent:
                    continue
                # A view of this agent (`agent_tool`): some of its tools, its deps.
                missing = [n for n in sub.tools if n not in served.tools]
                if missing:
                    raise AgentDefinitionError(
                        f"agent {agent.name!r}: agent tool {tool.name!r} names tools it does "
                        f"not have: {', '.join(missing)}"
                    )
                view = ToolRegistry(replace(served.tools[n], top_level=True) for n in sub.tools)
                self._add(
                    ServedAgent(
                        agent,
                        name=view_name(agent.name, tool.name),
                        tools=view,
                        instructions=sub.instructions,
                        settings=settings,
                        models=models,
                        deps=deps,
                        environ=environ,
                        tool_lists=self.tool_lists,
                    )
                )
        self.default = agents[0].name

    def _add(self, served: ServedAgent) -> None:
        if served.name in self.served:
            raise AgentDefinitionError(
                f"two agents are named {served.name!r}; give each agent a name of its own"
            )
        self.served[served.name] = served

    @property
    def names(self) -> list[str]:
        return list(self.served)

    def get(self, name: str = "") -> ServedAgent:
        """The agent called `name` (empty: the first one given); `UnknownAgent` else."""
        found = self.served.get(name or self.default)
        if found is None:
            raise UnknownAgent(name, self.names)
        return found

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[Agents]:
        """Open every agent's deps and context sources (once each: a knowledge index is
        built here) for as long as the worker runs."""
        async with contextlib.AsyncExitStack() as stack:
            for deps in self._deps:
                await deps.open(stack)
            sources = {id(s): s for served in self.served.values() for s in served.sources}
            for source in sources.values():
                await stack.enter_async_context(source.opened())
            yield self


def ids_of(tools: ToolRegistry) -> Ids:
    """The ids the tools take (see `Ids`), in order, once each."""
    patterns: dict[str, None] = {}
    nouns: dict[str, None] = {}
    for tool in tools.tools.values():
        for param in required_params(tool.spec):
            pattern = tool.spec.parameters["properties"][param.name].get("pattern")
            if pattern and param.is_id:  # one argfill searches for (`safe_for_backtracking`)
                patterns[pattern] = None
                nouns[id_noun(param)] = None
    return Ids(patterns=tuple(patterns), nouns=tuple(nouns))


def subagents_of(agents: Sequence[Agent]) -> list[Agent]:
    """The agents, then every agent reachable through their agent tools, once each."""
    seen: dict[int, Agent] = {}
    todo = list(agents)
    while todo:
        a = todo.pop(0)
        if id(a) in seen:
            continue
        seen[id(a)] = a
        todo.extend(t.delegate for t in _registry(a).tools.values() if t.delegate is not None)
    return list(seen.values())


def _registry(agent: Agent) -> ToolRegistry:
    if not isinstance(agent, Agent):
        fix = "give the Agent it returns" if callable(agent) else "from durable_agent import Agent"
        raise AgentDefinitionError(f"{_described(agent)} is not an Agent ({fix})")
    try:
        return agent.registry
    except NotATool as e:
        raise AgentDefinitionError(f"agent {agent.name!r}: {e}") from None
    except ValueError as e:  # BadToolName, DuplicateTool: each says what to fix
        raise AgentDefinitionError(f"agent {agent.name!r}: {e}") from None


def _described(value: object) -> str:
    """`5 (an int)`, `<function make at 0x…> (a function)`: a value and its kind."""
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    shown = repr(value)
    return f"{shown[:57] + '...' if len(shown) > 60 else shown} ({article} {kind})"


def _view_fingerprint(instructions: str, tools: ToolRegistry) -> str:
    probe = Agent(name="view", instructions=instructions, tools=tools)
    return probe.fingerprint()


def load(specs: Sequence[str], *, flag: str = "--agent") -> list[Agent]:
    """The agents named `module:attribute` (an `Agent`, or a function that returns one),
    importable from the current directory and PYTHONPATH. Every problem is one
    `AgentDefinitionError` line that names the spec and what to fix."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        # As `python -m` and ASGI servers do: a person's module lives in their folder.
        sys.path.insert(0, cwd)
    return [_load_one(spec.strip(), flag) for spec in specs]


def _load_one(spec: str, flag: str) -> Agent:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise AgentDefinitionError(
            f"{flag} {spec!r}: give MODULE:ATTRIBUTE, e.g. {flag} mypkg.agents:bookstore"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise AgentDefinitionError(
                f"{flag} {spec}: no module named {e.name!r} in the current directory "
                f"({os.getcwd()}) or on PYTHONPATH"
            ) from None
        raise AgentDefinitionError(f"{flag} {spec}: importing {module_name} failed: {e}") from None
    except SystemExit as e:
        # A script's `sys.exit()` run on import would end the worker, silently and with
        # its code (0: "success").
        raise AgentDefinitionError(
            f"{flag} {spec}: importing {module_name} exited (sys.exit({e.code!r})); a module "
            "that defines agents must not exit on import: put its script part under "
            "`if __name__ == '__main__':`"
        ) from None
    except Exception as e:
        raise AgentDefinitionError(
            f"{flag} {spec}: importing {module_name} failed: {type(e).__name__}: {e}"
        ) from None
    try:
        found = getattr(module, attribute)
    except AttributeError:
        raise AgentDefinitionError(
            f"{flag} {spec}: module {module_name} has no attribute {attribute!r}"
        ) from None
    except Exception as e:  # a module's own __getattr__
        raise AgentDefinitionError(
            f"{flag} {spec}: reading {module_name}.{attribute} failed: {type(e).__name__}: {e}"
        ) from None
    named = f"{module_name}.{attribute}"
    if callable(found) and not isinstance(found, Agent):
        try:
            found = found()
        except SystemExit as e:  # `sys:exit`, or a factory that exits: not an Agent
            raise AgentDefinitionError(
                f"{flag} {spec}: calling {attribute}() exited (sys.exit({e.code!r})); give "
                "an Agent, or a function that returns one"
            ) from None
        except Exception as e:
            raise AgentDefinitionError(
                f"{flag} {spec}: calling {attribute}() failed: {type(e).__name__}: {e}"
            ) from None
        if not isinstance(found, Agent):
            raise AgentDefinitionError(
                f"{flag} {spec}: {named}() returned {_described(found)}, not an Agent "
                "(from durable_agent import Agent)"
            )
    if not isinstance(found, Agent):
        raise AgentDefinitionError(
            f"{flag} {spec}: {named} is {_described(found)}, not an Agent "
            "(from durable_agent import Agent), nor a function returning one"
        )
    try:
        _registry(found)
    except AgentDefinitionError as e:
        raise AgentDefinitionError(f"{flag} {spec}: {e}") from None
    return found
