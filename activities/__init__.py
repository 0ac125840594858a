"""The turn's activities, one file per kind. Each is a thin layer over `agent/`.

Its names load on first use (`__getattr__`): the client side reads the light ones (a
valid call, an activity's output) without loading every activity and, through them,
the tools' and the shields' machinery."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from durable_agent.activities._model_call import ModelCallInput, Spending
    from durable_agent.activities.calls import ValidCall
    from durable_agent.activities.compact import CompactActivity, CompactInput, CompactOutput
    from durable_agent.activities.dispatch import DispatchActivity, DispatchInput, DispatchOutput
    from durable_agent.activities.instructions import (
        InstructionsActivity,
        InstructionsInput,
        InstructionsOutput,
    )
    from durable_agent.activities.interpret import (
        InterpretActivity,
        InterpretInput,
        InterpretOutput,
    )
    from durable_agent.activities.parse import ParseActivity, ParseInput, ParseOutput, Rejection
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

_HOMES = {
    "CompactActivity": "compact",
    "CompactInput": "compact",
    "CompactOutput": "compact",
    "DispatchActivity": "dispatch",
    "DispatchInput": "dispatch",
    "DispatchOutput": "dispatch",
    "InstructionsActivity": "instructions",
    "InstructionsInput": "instructions",
    "InstructionsOutput": "instructions",
    "InterpretActivity": "interpret",
    "InterpretInput": "interpret",
    "InterpretOutput": "interpret",
    "ModelCallInput": "_model_call",
    "ParseActivity": "parse",
    "ParseInput": "parse",
    "ParseOutput": "parse",
    "ParseOutputActivity": "parse_output",
    "ParseOutputInput": "parse_output",
    "ParseOutputOutput": "parse_output",
    "PlanActivity": "plan",
    "PlanInput": "plan",
    "PlanOutput": "plan",
    "PricesActivity": "prices",
    "PricesInput": "prices",
    "PricesOutput": "prices",
    "RecheckActivity": "recheck",
    "RecheckInput": "recheck",
    "RecheckOutput": "recheck",
    "RetrieveActivity": "retrieve",
    "RetrieveInput": "retrieve",
    "RetrieveOutput": "retrieve",
    "SampleActivity": "sample",
    "SampleInput": "sample",
    "SampleOutput": "sample",
    "Rejection": "parse",
    "ShieldActivity": "shield",
    "ShieldInput": "shield",
    "ShieldOutput": "shield",
    "ValidCall": "calls",
}
"""The module of each public name."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # `__import__`, not `importlib`: inside Temporal's sandbox it goes through the
    # sandbox's importer, as an import statement does.
    module = __import__(f"{__name__}.{home}", fromlist=[name])
    return getattr(module, name)


def turn_activities(agents: Agents, spending: Spending | None = None) -> list[Callable[..., Any]]:
    """All activities of a turn, bound to the agents one worker serves: each resolves
    the turn's agent by name (its tools, instructions, models, shields, approvals, deps).
    The two model calls share the conversations they put together (`Transcripts`) with
    the activities that read them (parse, shield). Every model call (plan, interpret,
    compact, sample) reserves from the budgets when some are set (`spending`)."""
    # The worker's imports: the module's names stay lazy for the client side.
    from durable_agent.activities._conversation import Conversations
    from durable_agent.activities.compact import CompactActivity
    from durable_agent.activities.dispatch import DispatchActivity
    from durable_agent.activities.instructions import InstructionsActivity
    from durable_agent.activities.interpret import InterpretActivity
    from durable_agent.activities.parse import ParseActivity
    from durable_agent.activities.parse_output import ParseOutputActivity
    from durable_agent.activities.plan import PlanActivity
    from durable_agent.activities.prices import PricesActivity
    from durable_agent.activities.recheck import RecheckActivity
    from durable_agent.activities.retrieve import RetrieveActivity
    from durable_agent.activities.sample import SampleActivity
    from durable_agent.activities.shield import ShieldActivity
    from durable_agent.transcript import Transcripts

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
