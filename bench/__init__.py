"""Benchmark of agent turns against Temporal's own floor and the peers
(`python -m durable_agent.bench`)."""

QUESTION = "Which item was ordered for 123456?"
"""Every system's one-tool turn: one order lookup, answered with the item."""
