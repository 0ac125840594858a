"""Peers in the benchmark: other durable agents on Temporal doing the same turns.

    python -m durable_agent.bench --peers      (needs the `peers` extra: pip install -e ".[peers]")

Each peer answers "Which item was ordered for 123456?" with the demo shop's order
lookup, driven by a scripted model (`bench.peers.script`: no network, the same
decisions as `bench.models.TaskModel`), in a worker process of its own
(`python -m durable_agent.bench.peers.worker`) on a task queue of its own. This module names the
peers and what crosses between the benchmark and their workflows; it imports none of
their packages, so `python -m durable_agent.bench` works without the extra.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

INSTALL = 'pip install -e ".[peers]"'


@dataclass(frozen=True)
class Peer:
    """A peer as the benchmark drives it from outside: by names, never by import."""

    name: str
    """Its key in the results, and its module under `bench.peers`."""
    workflow: str
    """The workflow type its worker registers."""
    model_activity: str
    """Part of the activity type of its model calls: they are counted in the history."""
    distributions: tuple[str, ...]
    """Its packages, whose versions the results record."""
    imports: tuple[str, ...]
    """The modules it needs, all from the `peers` extra."""


PEERS = (
    Peer(
        name="pydantic_ai",
        workflow="PydanticAITurn",
        model_activity="__model_request",
        distributions=("pydantic-ai-slim",),
        imports=("pydantic_ai",),
    ),
    Peer(
        name="openai_agents",
        workflow="OpenAIAgentsTurn",
        model_activity="invoke_model_activity",
        distributions=("openai-agents", "temporalio-openai-agents"),
        imports=("agents", "temporalio.openai_agents"),
    ),
    Peer(
        name="langgraph",
        workflow="LangGraphTurn",
        model_activity="shop_support.agent",
        distributions=("langgraph", "langchain-core", "temporalio-langgraph"),
        imports=("langgraph", "langchain_core", "temporalio.langgraph"),
    ),
)


@dataclass
class PeerTurnInput:
    """A peer workflow's input. A dataclass, so every side's data converter (the
    default one here, each peer's own in its worker) reads it alike."""

    question: str
    task: str = "one tool"
    """One of `bench.models.TASKS`: which calls the scripted model asks for."""


@dataclass
class LongPeerInput:
    """A peer's long turn (`bench.long`): read documents 1..`steps`, then answer."""

    question: str
    steps: int


@dataclass
class PeerTurnOutput:
    answer: str


class PeersNotInstalled(Exception):
    """The `peers` extra is missing; the message says what and how to install it."""


def check_installed() -> None:
    """Raise `PeersNotInstalled` unless every peer's modules can be imported."""
    missing = [name for peer in PEERS for name in peer.imports if not _importable(name)]
    if missing:
        raise PeersNotInstalled(
            f"--peers needs the peers' packages (missing: {', '.join(missing)}); "
            f"install them with: {INSTALL}"
        )


def versions() -> dict[str, dict[str, str]]:
    """The installed version of each peer's packages."""
    return {
        peer.name: {d: importlib.metadata.version(d) for d in peer.distributions} for peer in PEERS
    }


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or blocked
        return False
