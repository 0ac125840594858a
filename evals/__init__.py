"""Evaluations that survive crashes: τ²-bench domains and AgentDojo suites served as agents,
each task a durable episode scored by the benchmark's own checks
(`python -m durable_agent.evals`)."""
