"""Memory: what a customer told an agent, kept across their conversations.

    from durable_agent import Agent
    from durable_agent.memory import MemorySettings

    agent = Agent(name="support", memory=True)  # or memory=MemorySettings(recall=3)

The agent gets `remember(fact)` and `forget(memory_id)` (writes) and `recall(query)`
(a read), and each turn starts with the customer's memories most relevant to the
question; all of them are scoped to the tenant and customer the turn serves, never to
what the model writes. Kept in SQLite under the state folder (`SQLiteMemoryStore`), in
PostgreSQL (`PostgresMemoryStore`), or any `MemoryStore`; seen and deleted from outside
with `AgentClient.memory` and `durable-agent memory`. See docs/knowledge-and-memory.md.
"""

from durable_agent.memory._access import MemoryAccess
from durable_agent.memory._memory import (
    FORGET_TOOL,
    RECALL_TOOL,
    REMEMBER_TOOL,
    Memory,
    MemorySettings,
)
from durable_agent.memory._postgres import PostgresMemoryStore
from durable_agent.memory._store import (
    MEMORY_ID,
    MemoryStore,
    Remembered,
    SQLiteMemoryStore,
    memory_id,
)

__all__ = [
    "FORGET_TOOL",
    "MEMORY_ID",
    "RECALL_TOOL",
    "REMEMBER_TOOL",
    "Memory",
    "MemoryAccess",
    "MemorySettings",
    "MemoryStore",
    "PostgresMemoryStore",
    "Remembered",
    "SQLiteMemoryStore",
    "memory_id",
]
