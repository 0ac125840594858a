"""What the client side imports: every public name still resolves, the light module of
the workflows' names says what the workflows define, and a CLI process loads neither
the workflows' definitions nor the activities nor the worker's SDK (each started
`client.py` paid for them, 1.7 to 1.9 s of imports before it did anything)."""

from __future__ import annotations

import subprocess
import sys

from temporalio import workflow

import durable_agent
from durable_agent import activities
from durable_agent.workflows import names


def test_every_public_name_imports() -> None:
    for package in (durable_agent, activities):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)


def test_the_names_the_client_calls_are_the_workflows_own() -> None:
    from durable_agent.workflows import AgentTurn, Conversation

    turn = workflow._Definition.must_from_class(AgentTurn)
    chat = workflow._Definition.must_from_class(Conversation)
    assert turn.name == names.TURN
    assert names.PROGRESS in turn.queries
    assert {names.ANSWER, names.DECIDE, names.EVENT, names.WAKE} <= set(turn.updates)
    later = {names.ANSWER_LATER, names.DECIDE_LATER, names.EVENT_LATER, names.WAKE_LATER}
    assert later <= set(turn.signals)
    assert chat.name == names.CONVERSATION
    assert names.SEND in chat.updates
    assert names.END in chat.signals
    assert names.STATE in chat.queries


def test_the_cli_loads_no_workflow_activity_or_worker() -> None:
    heavy = [
        "durable_agent.workflows.turn",
        "durable_agent.workflows.conversation",
        "durable_agent.activities.parse",
        "durable_agent.activities.dispatch",
        "temporalio.worker",
    ]
    probe = (
        "import sys, durable_agent.commands.client; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == ""
