"""A customer's memories from outside the turns: listed, exported and deleted
(`AgentClient.memory`, `durable-agent memory`)."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from durable_agent.errors import AgentClientError, UnknownMemory, UnknownTurn
from durable_agent.memory._memory import resolved
from durable_agent.memory._store import MemoryStore, Remembered, in_state_folder, state_file
from durable_agent.principal import DEFAULT_TENANT, Principal

if TYPE_CHECKING:
    from durable_agent.runtime.erase import Erased


class Eraser(Protocol):
    """`AgentClient.erase`: erases a turn (with its conversation, if asked)."""

    def __call__(
        self, workflow_id: str, *, conversation: bool = ...
    ) -> Awaitable[list[Erased]]: ...


class MemoryAccess:
    """The memories of one store (by default `<state folder>/memory/<name>.sqlite3`, the
    file the workers of this folder keep them in; `store`: the one the agent's
    `MemorySettings(store=...)` makes), by customer: the application's word on who the
    customer is, as a turn's principal is.

        await agents.memory.list("c-42", tenant="acme")
        await agents.memory.forget("mem_0123456789abcdef", customer="c-42", tenant="acme")
    """

    def __init__(
        self,
        name: str = "memory",
        store: Callable[[], MemoryStore] | None = None,
        erase: Eraser | None = None,
    ) -> None:
        self.name = name
        self._make_store = store
        self._erase = erase

    def _open(self) -> MemoryStore | None:
        """The store; None when it is the state folder's file and there is none yet (a
        look from outside never makes an empty one)."""
        if self._make_store is not None:
            return self._make_store()
        if not state_file(self.name).exists():
            return None
        return in_state_folder(self.name)

    async def _with_store(self, fn: Callable[[MemoryStore], Any], none: Any) -> Any:
        def run() -> Any:
            store = self._open()
            if store is None:
                return none
            try:
                return fn(store)
            finally:
                store.close()

        return await asyncio.to_thread(run)

    async def list(self, customer: str, *, tenant: str = DEFAULT_TENANT) -> list[Remembered]:
        """The customer's memories, oldest first."""
        who = _owner(customer, tenant)
        found: list[Remembered] = await self._with_store(
            lambda s: s.list(who.tenant, who.user), none=[]
        )
        return found

    async def export(self, customer: str, *, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        """The customer's memories as one JSON-ready object (a copy for them to have)."""
        memories = await self.list(customer, tenant=tenant)
        return {
            "tenant": tenant,
            "customer": customer,
            "memories": [m.model_dump(mode="json") for m in memories],
        }

    async def forget(
        self,
        memory_id: str,
        *,
        customer: str,
        tenant: str = DEFAULT_TENANT,
        erase_turn: bool = False,
        conversation: bool = False,
    ) -> builtins.list[Erased]:
        """Deletes the customer's memory `memory_id` from the store: no later turn recalls
        it. `UnknownMemory` when that customer has none of that id.

        `erase_turn`: first erase the turn that told it (`Remembered.turn`), where the
        customer's words stay otherwise (`AgentClient.erase`; with `conversation`, its
        whole conversation, which such a turn needs): the runs erased. When the erasure
        is refused (`CannotErase`) nothing is forgotten; a turn already gone is no
        error. Needs the access of an `AgentClient` (`agents.memory`)."""
        who = _owner(customer, tenant)
        erased: builtins.list[Erased] = []
        if erase_turn:
            if self._erase is None:
                raise AgentClientError(
                    "erase_turn needs a Temporal client: use AgentClient.memory.forget"
                )
            mine = [m for m in await self.list(customer, tenant=tenant) if m.id == memory_id]
            if not mine:
                raise self._unknown(memory_id, customer, tenant)
            if turn := mine[0].turn:
                with contextlib.suppress(UnknownTurn):  # erased, or past its retention
                    erased = await self._erase(turn, conversation=conversation)
        gone = await self._with_store(
            lambda s: s.forget(who.tenant, who.user, memory_id), none=False
        )
        if not gone and not erased:
            raise self._unknown(memory_id, customer, tenant)
        return erased

    async def words_for(
        self, customer: str, *, tenant: str = DEFAULT_TENANT
    ) -> Callable[[str], str]:
        """What turns a turn's recorded text (`[memory mem_…]`, as the recall records a
        memory) into what it recalled, for the turn's own customer: each reference in
        the words of their memory of that id, or `[forgotten memory mem_…]` when they
        have none (forgotten since). With no store file here yet, the text as it is
        (its memories may be kept elsewhere). `show` prints steps so."""
        who = _owner(customer, tenant)
        theirs: dict[str, Remembered] | None = await self._with_store(
            lambda s: {m.id: m for m in s.list(who.tenant, who.user)}, none=None
        )
        if theirs is None:
            return str
        return lambda text: resolved(text, theirs) if "[memory mem_" in text else text

    @staticmethod
    def _unknown(memory_id: str, customer: str, tenant: str) -> UnknownMemory:
        return UnknownMemory(
            f"no memory {memory_id[:40]!r} of customer {customer[:80]!r} (tenant "
            f"{tenant[:64]!r}): `durable-agent memory list --customer ID` shows theirs"
        )


def _owner(customer: str, tenant: str) -> Principal:
    try:
        return Principal(user=customer, tenant=tenant)
    except ValidationError as e:
        said = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise UnknownMemory(f"no such customer: {said}") from None
