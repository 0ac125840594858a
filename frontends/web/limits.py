"""How often one client may start conversations and send messages.

    AGENT_WEB_CHAT_RATE       new conversations a client may start (default 5/minute)
    AGENT_WEB_MESSAGE_RATE    messages a client may send, a new conversation's first
                              one included (default 20/minute)
    AGENT_WEB_TRUSTED_PROXIES addresses or networks of the gateways in front of the
                              chat (`10.0.0.7,10.1.0.0/16`); only a request from one of
                              them has its client read from X-Forwarded-For

A rate is `COUNT/second`, `COUNT/minute` or `COUNT/hour` (`off`: no limit). Each
client has a bucket of COUNT that refills evenly over the period: a burst of COUNT,
then one every period/COUNT; a request over it is answered 429 with `Retry-After`.
Every conversation runs its turns on the workers for as long as it lives, so without
this one page could start hundreds a minute.

The client is the connection's remote address (an IPv6 one by its /64, the block a
single host is given). X-Forwarded-For is anyone's to write, so it counts only on a
request whose remote address is a trusted gateway, and then the client is the
rightmost address in it that is not one of those gateways.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from durable_agent.errors import AgentClientError

CHAT_RATE_SETTING = "AGENT_WEB_CHAT_RATE"
MESSAGE_RATE_SETTING = "AGENT_WEB_MESSAGE_RATE"
PROXIES_SETTING = "AGENT_WEB_TRUSTED_PROXIES"
DEFAULT_CHAT_RATE = "5/minute"
DEFAULT_MESSAGE_RATE = "20/minute"
MAX_CLIENTS = 10_000
"""Clients remembered at once; past it, the ones whose buckets are full again (they
have nothing to remember) are forgotten, then the least recently seen."""
PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Rate:
    """`count` requests per `period` seconds; `count` 0: no limit."""

    count: int
    period: float

    @classmethod
    def parse(cls, setting: str, text: str) -> Rate:
        value = text.strip().lower()
        if value in ("off", "0"):
            return cls(0, 1.0)
        found = re.fullmatch(r"(\d{1,6})\s*/\s*(second|minute|hour)s?", value)
        if not found or int(found[1]) == 0:
            raise AgentClientError(
                f"{setting}={text!r}: give a rate as COUNT/second, COUNT/minute or "
                "COUNT/hour (e.g. 5/minute), or off"
            )
        return cls(int(found[1]), PERIODS[found[2]])

    def __str__(self) -> str:
        if not self.count:
            return "no limit"
        unit = next(name for name, s in PERIODS.items() if s == self.period)
        return f"{self.count} {'an' if unit == 'hour' else 'a'} {unit}"


@dataclass(frozen=True)
class RateLimits:
    """The chat's limits per client, and the gateways whose X-Forwarded-For it believes."""

    chats: Rate = Rate.parse(CHAT_RATE_SETTING, DEFAULT_CHAT_RATE)
    messages: Rate = Rate.parse(MESSAGE_RATE_SETTING, DEFAULT_MESSAGE_RATE)
    trusted_proxies: tuple[Network, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RateLimits:
        env = os.environ if environ is None else environ
        return cls(
            chats=Rate.parse(CHAT_RATE_SETTING, env.get(CHAT_RATE_SETTING, DEFAULT_CHAT_RATE)),
            messages=Rate.parse(
                MESSAGE_RATE_SETTING, env.get(MESSAGE_RATE_SETTING, DEFAULT_MESSAGE_RATE)
            ),
            trusted_proxies=_networks(env.get(PROXIES_SETTING, "")),
        )


def _networks(text: str) -> tuple[Network, ...]:
    found = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        try:
            found.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise AgentClientError(
                f"{PROXIES_SETTING}: {item!r} is not an address or network "
                "(e.g. 10.0.0.7 or 10.1.0.0/16)"
            ) from None
    return tuple(found)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def client_key(peer: str, forwarded_for: Iterable[str], trusted: tuple[Network, ...]) -> str:
    """Who a request counts against: its remote address `peer`, or, when that is a
    trusted gateway, the rightmost address of X-Forwarded-For (every such header's
    values, in order) that is not one; an IPv6 client by its /64."""

    def is_trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in network for network in trusted)

    client = _address(peer)
    if client is not None and is_trusted(client):
        hops = [h for value in forwarded_for for h in value.split(",") if h.strip()]
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                break  # a value no gateway of ours wrote: believe nothing left of it
            client = address
            if not is_trusted(address):
                break
    if client is None:
        return peer or "unknown"
    if isinstance(client, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((client, 64), strict=False))
    return str(client)


class Buckets:
    """One token bucket per client for `rate`: `take(client)` is None when the request
    may go ahead, else how many seconds until it may."""

    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """client → (tokens, when counted), least recently seen first."""

    def take(self, client: str) -> float | None:
        if not self.rate.count:
            return None
        now = self.clock()
        tokens = self._tokens(client, now)
        self._buckets[client] = (tokens, now)
        self._buckets.move_to_end(client)
        if tokens < 1:
            return (1 - tokens) * self.rate.period / self.rate.count
        self._buckets[client] = (tokens - 1, now)
        self._forget(now)
        return None

    def _tokens(self, client: str, now: float) -> float:
        held, since = self._buckets.get(client, (float(self.rate.count), now))
        refilled = (now - since) * self.rate.count / self.rate.period
        return min(float(self.rate.count), held + refilled)

    def _forget(self, now: float) -> None:
        if len(self._buckets) <= MAX_CLIENTS:
            return
        for client in [c for c in self._buckets if self._tokens(c, now) >= self.rate.count]:
            del self._buckets[client]
        # Down to nine tenths, so that a crowd of new clients is not a scan each.
        while len(self._buckets) > MAX_CLIENTS - MAX_CLIENTS // 10:
            self._buckets.popitem(last=False)


def retry_after(seconds: float) -> str:
    """A `Retry-After` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
