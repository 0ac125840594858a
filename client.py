"""The `durable-agent` command, run from a clone: `python client.py ask "…"`.

The command itself is `durable_agent.commands.client`; installed, it is `durable-agent`.
"""

from durable_agent.commands.client import run

if __name__ == "__main__":
    run()
