"""Are the agent's search attributes registered on the namespace? Register them if we may.

Temporal refuses a workflow started with an unknown search attribute, so the
client checks once per process and starts turns without them when they are
missing (turns still run; they just cannot be filtered). The worker registers
them where the server allows it (a self-hosted or dev server) and otherwise
says, in one line, how to.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from durable_agent.workflows import search

_known: dict[int, bool] = {}


async def missing(client: Client) -> list[str]:
    """Names of the agent's search attributes the namespace lacks."""
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    have = set(resp.custom_attributes) | set(resp.system_attributes)
    return [k.name for k in search.ALL if k.name not in have]


async def available(client: Client) -> bool:
    """Whether turns can be started with them (checked once per client)."""
    if id(client) not in _known:
        try:
            _known[id(client)] = not await missing(client)
        except RPCError:  # e.g. a Cloud API key without operator access
            _known[id(client)] = False
    return _known[id(client)]


async def ensure(client: Client) -> str | None:
    """Register what is missing; None when all are there, else one line saying
    what is missing and the command that fixes it."""
    try:
        absent = await missing(client)
        if absent:
            kinds = {
                k.name: (
                    IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST
                    if k is search.TOOLS
                    else IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                )
                for k in search.ALL
                if k.name in absent
            }
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=kinds)
            )
            absent = await missing(client)
    except RPCError as e:
        return (
            f"cannot check or register the search attributes ({e.message}); turns run, but "
            f"cannot be filtered until someone runs: {search.create_command()}"
        )
    if absent:
        return (
            f"search attributes {', '.join(absent)} are not registered on namespace "
            f"{client.namespace!r}; turns run, but cannot be filtered until someone runs: "
            f"{search.create_command(absent)}"
        )
    _known[id(client)] = True
    return None
