"""What the test kit raises: one line each, saying what to do.

ServerLacks        (an AgentClientError) the time-skipping test server cannot do this:
                   run the test on the dev server, `agent_test(..., server="dev")`
NoConsentAsked     (an AssertionError) the turn ended, or the wait ran out, with no
                   call awaiting consent
ReplayFailed       (an AssertionError) recorded turns that the current code cannot
                   continue: one line per history
"""

from __future__ import annotations

from durable_agent.errors import AgentClientError


class ServerLacks(AgentClientError):
    """A request the time-skipping test server has no service for."""

    def __init__(self, what: str, because: str) -> None:
        super().__init__(
            f"{what} needs {because}, which the time-skipping test server does not have: "
            'run this test on the dev server, agent_test(..., server="dev")'
        )


class NoConsentAsked(AssertionError):
    """A turn a test waited on asked nobody for consent."""


class ReplayFailed(AssertionError):
    """Recorded turns that do not replay on the current code (one line each)."""
