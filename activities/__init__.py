"""The turn's activities, one file per kind. Each is a thin layer over `agent/`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable_agent.activities._conversation import Conversations
from durable_agent.activities._model_call import ModelCallInput, Spending
from durable_agent.activities.compact import CompactActivity, CompactInput, CompactOutput
from durable_agent.activities.dispatch import DispatchActivity, DispatchInput, DispatchOutput
from durable_agent.activities.instructions import (
    InstructionsActivity,
    InstructionsInput,
    InstructionsOutput,
)
from durable_agent.activities.interpret import InterpretActivity, InterpretInput, InterpretOutput
from durable_agent.activities.parse import (
    ParseActivity,
    ParseInput,
    ParseOutput,
    Rejection,
    ValidCall,
)
from durable_agent.activities.parse_output import (
    ParseOutputActivity,
    ParseOutputInput,
    ParseOutputOutput,
)
from durable_agent.activities.plan import PlanActivity, PlanInput, PlanOutput
from durable_agent.activities.prices import PricesActivity, PricesInput, PricesOutput
from durable_agent.activities.recheck import RecheckActivity, RecheckInput, RecheckOutput
from durable_agent.activities.retrieve import RetrieveActivity, RetrieveInput, RetrieveOutput
from durable_agent.activities.sample import SampleActivity, SampleInput, SampleOutput
from durable_agent.activities.shield import ShieldActivity, ShieldInput, ShieldOutput
from durable_agent.serving import Agents
from durable_agent.transcript import Transcripts


def turn_activities(agents: Agents, spending: Spending | None = None) -> list[Callable[..., Any]]:
    """All activities of a turn, bound to the agents one worker serves: each resolves
    the turn's agent by name (its tools, instructions, models, shields, approvals, deps).
    The two model calls share the conversations they put together (`Transcripts`) with
    the activities that read them (parse, shield). Every model call (plan, interpret,
    compact, sample) reserves from the budgets when some are set (`spending`)."""
    transcripts = Transcripts()
    conversations = Conversations(transcripts)
    return [
        ShieldActivity(agents, conversations).shield,
        PlanActivity(agents, transcripts=transcripts, spending=spending).plan,
        ParseActivity(agents, conversations).parse,
        *_both(DispatchActivity(agents)),
        ParseOutputActivity(agents).parse_output,
        InterpretActivity(agents, transcripts=transcripts, spending=spending).interpret,
        CompactActivity(
            agents, transcripts=transcripts, conversations=conversations, spending=spending
        ).compact,
        InstructionsActivity(agents).instructions,
        PricesActivity(agents).prices,
        RecheckActivity(agents).recheck,
        RetrieveActivity(agents).retrieve,
        SampleActivity(agents, transcripts=transcripts, spending=spending).sample,
    ]


def _both(dispatch: DispatchActivity) -> list[Callable[..., Any]]:
    """A tool's run and its check (before consent): one holder, two activity kinds."""
    return [dispatch.dispatch, dispatch.check]


__all__ = [
    "CompactActivity",
    "CompactInput",
    "CompactOutput",
    "DispatchActivity",
    "DispatchInput",
    "DispatchOutput",
    "InstructionsActivity",
    "InstructionsInput",
    "InstructionsOutput",
    "InterpretActivity",
    "InterpretInput",
    "InterpretOutput",
    "ModelCallInput",
    "ParseActivity",
    "ParseInput",
    "ParseOutput",
    "ParseOutputActivity",
    "ParseOutputInput",
    "ParseOutputOutput",
    "PlanActivity",
    "PlanInput",
    "PlanOutput",
    "PricesActivity",
    "PricesInput",
    "PricesOutput",
    "RecheckActivity",
    "RecheckInput",
    "RecheckOutput",
    "RetrieveActivity",
    "RetrieveInput",
    "RetrieveOutput",
    "SampleActivity",
    "SampleInput",
    "SampleOutput",
    "Rejection",
    "ShieldActivity",
    "ShieldInput",
    "ShieldOutput",
    "ValidCall",
    "turn_activities",
]
