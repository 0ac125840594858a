"""Temporal workflows. One turn of the agent is one `AgentTurn` workflow."""

from workflows.turn import AgentTurn

__all__ = ["AgentTurn"]
