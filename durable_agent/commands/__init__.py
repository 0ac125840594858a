"""The project's commands: `durable-agent` (`client.py`) and `durable-agent-worker`
(`worker.py`). The files at the repository's root are thin entry points into these."""
