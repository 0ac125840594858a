"""Benchmark of agent turns against Temporal's own floor (`python -m bench`)."""
