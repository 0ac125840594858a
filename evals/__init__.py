"""Evaluations that survive crashes: τ²-bench domains served as agents, each task a
durable episode scored by the benchmark's own evaluator (`python -m durable_agent.evals`)."""
