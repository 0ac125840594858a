"""Does a worker's memory stay flat? Its resident memory over many turns.

A leak (a cache that only grows, a task never collected, history kept per turn)
shows as resident memory rising with the number of turns; a flat line after the
first turns (imports, caches and the workflow cache filling) is what a long-lived
worker needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from durable_agent.bench.measure import memory_mb

WARM_UP = 50
"""Turns before the first reading: start-up allocations are not a leak."""


async def rss_over_turns(
    pid: int, turn: Callable[[], Awaitable[Any]], turns: int, every: int, concurrency: int
) -> list[float]:
    """Resident memory (MB) of worker `pid` after warming up, then after every
    `every` of `turns` turns, run `concurrency` at a time."""
    await _turns(turn, WARM_UP, concurrency)
    samples = [_rss(pid)]
    for done in range(0, turns, every):
        await _turns(turn, min(every, turns - done), concurrency)
        samples.append(_rss(pid))
    return samples


def start_middle_end(samples: list[float]) -> dict[str, float]:
    return {"start": samples[0], "middle": samples[len(samples) // 2], "end": samples[-1]}


async def _turns(turn: Callable[[], Awaitable[Any]], n: int, concurrency: int) -> None:
    for done in range(0, n, concurrency):
        await asyncio.gather(*(turn() for _ in range(min(concurrency, n - done))))


def _rss(pid: int) -> float:
    return memory_mb(pid)["rss_mb"]
