"""The `durable-agent-worker` command, run from a clone: `python worker.py --agent mod:agent`.

The command itself is `durable_agent.commands.worker`; installed, it is
`durable-agent-worker`.
"""

from durable_agent.commands.worker import main

if __name__ == "__main__":
    main()
