"""Long turns: one turn of 1,000 steps, each reading a 20 KB document.

    python -m durable_agent.bench --long [--steps 1000] [--doc-kb 20] [--write-every 100]
                    [--kill-every 30] [--kill-at-writes] [--no-peers] [--peer-budget 600]
                    [--payload-store local|off]

On its own dev server (SQLite file, as the rest of the benchmark), a worker process
serves the long turn's agent (`bench.long_agent`, defined with the public API) and
the turn reads documents 1..N, one per round, saving a checkpoint (a write) every
`--write-every` rounds, then answers with the last document's last word. Measured:

- the turn completed, and its answer quotes the last result;
- its history over every run (it continues as new): bytes as JSON and as the server
  stores them, and events;
- the step time (`bench.long_history`), median over steps 10–100 and 900–1,000;
- the worker's resident memory at step 100 and at the end;
- the story: every document read once, no step lost or repeated; every checkpoint
  written once (counted in a SQLite file outside the worker).

`--kill-every S` SIGKILLs the worker about every S seconds and starts another;
`--kill-at-writes` SIGKILLs it right after each checkpoint is written, before
Temporal hears of it, so that every write runs again on the next worker. The turn
must still lose no step and repeat no write (its step times and memory then say
nothing, and are not checked). The same steps run in a plain Python loop (no
Temporal) for the step time side by side, and on the peers (`bench.peers.long_peers`),
each as far as it gets within its budget.
"""

from __future__ import annotations

import asyncio
import os
import platform
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from subprocess import Popen
from typing import Any

from temporalio.client import Client

from durable_agent import AgentClient, TurnLimits
from durable_agent.bench import long_history, peers
from durable_agent.bench.long_agent import MODEL_KIND, NAME
from durable_agent.bench.long_loop import plain_loop
from durable_agent.bench.long_script import QUESTION, READ, Scenario
from durable_agent.bench.measure import memory_mb, spawn, stop
from durable_agent.render import MAX_OBSERVATION_CHARS
from durable_agent.runtime import turns
from durable_agent.runtime.codec import data_converter
from durable_agent.runtime.server import EmbeddedServer, free_port, open_client
from durable_agent.runtime.storage import DEFAULT_THRESHOLD, STORE_ENV, THRESHOLD_ENV
from durable_agent.shields import POSITIONS, ShieldSettings
from durable_agent.types import StepKind

TARGETS = {
    # Both as JSON (`temporal workflow show --output json`, the Web UI's download:
    # indented, payloads in base64) and as the server stores them (protobuf: what
    # Temporal's history size limits count).
    "history_bytes": 5_000_000,
    "history_events": 20_000,
    "step_time_ratio": 1.25,
    "rss_ratio": 1.5,
}
"""History over all runs under 5 MB (as JSON) and 20,000 events; the median step
time over steps 900–1,000 within 1.25× that over steps 10–100; the worker's memory
at the end within 1.5× that at step 100."""
MODEL_CALLS = {"plan", "interpret"}
RSS_EVERY_S = 0.25
KILL_JITTER = (0.8, 1.2)


def is_model(kind: str) -> bool:
    return kind in MODEL_CALLS


@dataclass
class LongOptions:
    steps: int = 1000
    doc_kb: float = 20
    write_every: int = 100
    window: int = 128_000
    """The model's context window (tokens)."""
    kill_every: float = 0
    """Seconds between SIGKILLs of the worker (0: none)."""
    kill_at_writes: bool = False
    """Also SIGKILL the worker right after each checkpoint is first written."""
    peers: bool = True
    peer_budget_s: float = 600
    payload_store: str = "local"
    """`local`: a folder in the run's own directory; `off`: every payload inline."""

    @property
    def scenario(self) -> Scenario:
        return Scenario(
            steps=self.steps,
            doc_chars=int(self.doc_kb * 1000),
            write_every=self.write_every,
            window=self.window,
        )


class WorkerSlot:
    """The long turn's worker process, and the one that replaces it when it is killed."""

    def __init__(
        self,
        address: str,
        task_queue: str,
        effects: Path,
        doc_chars: int,
        env: dict[str, str],
        hang_after_write: Path | None = None,
    ) -> None:
        hang = ("--hang-after-write", str(hang_after_write)) if hang_after_write else ()
        self.args = (address, task_queue, str(effects), "--doc-chars", str(doc_chars), *hang)
        self.env = env
        self.proc: Popen[str] | None = None
        self.kills: list[float] = []

    async def start(self) -> None:
        self.proc = await asyncio.to_thread(
            spawn, "durable_agent.bench.long_worker", *self.args, env=self.env
        )

    async def kill_and_restart(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills.append(time.time())
        await self.start()

    def rss_mb(self) -> float | None:
        try:
            return memory_mb(self.proc.pid)["rss_mb"] if self.proc else None
        except (FileNotFoundError, ProcessLookupError):
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop(self.proc)


async def run(opts: LongOptions) -> dict[str, Any]:
    scenario = opts.scenario
    tmp = Path(tempfile.mkdtemp(prefix="durable-agent-bench-long-"))
    server = EmbeddedServer(tmp / "temporal.db", port=free_port(), ui_port=free_port()).start()
    try:
        client = await open_client({"target_host": server.address}, wait=30)
        agent = await run_agent(client, server.address, opts, tmp)
        print("the same steps in a plain Python loop…", file=sys.stderr)
        loop = baseline(scenario, tmp / "loop-effects.db")
        peer_results: dict[str, Any] = {}
        if opts.peers:
            peer_results = await run_peers(client, server.address, scenario, opts.peer_budget_s)
    finally:
        server.stop()
        # Its database and payload store hold tens of megabytes: the figures are out.
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "command": "python -m durable_agent.bench --long",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "scenario": {
            "steps": scenario.steps,
            "doc_chars": scenario.doc_chars,
            "write_every": scenario.write_every,
            "window": scenario.window,
            "kill_every_s": opts.kill_every,
            "kill_at_writes": opts.kill_at_writes,
            "early_steps": list(scenario.early),
            "late_steps": list(scenario.late),
        },
        "settings": settings(opts),
        "agent": agent,
        "plain_loop": loop,
        "peers": peer_results,
    }


def settings(opts: LongOptions) -> dict[str, Any]:
    """What the agent's turn ran with."""
    limits = TurnLimits()
    shields = ShieldSettings.from_env()
    return {
        "payload_store": "a folder beside the server's database (local:…)"
        if opts.payload_store == "local"
        else "off (every payload inline)",
        "payload_threshold_bytes": int(os.environ.get(THRESHOLD_ENV) or DEFAULT_THRESHOLD),
        "continue_after_events": limits.continue_after_events,
        "continue_after_bytes": limits.continue_after_bytes,
        "max_result_chars": MAX_OBSERVATION_CHARS,
        "read_tool": "a regular activity",
        "shields": {p: ",".join(str(s) for s in shields.at(p)) or "none" for p in POSITIONS},
    }


async def run_agent(client: Client, address: str, opts: LongOptions, tmp: Path) -> dict[str, Any]:
    """The long turn on this project, its worker in a process of its own."""
    scenario = opts.scenario
    store = tmp / "payloads"
    env = {STORE_ENV: f"local:{store}" if opts.payload_store == "local" else "off"}
    config = client.config()
    config["data_converter"] = data_converter({**os.environ, **env})
    queue = f"bench-long-{uuid.uuid4().hex[:6]}"
    agents = AgentClient(Client(**config), task_queue=queue)
    effects = tmp / "effects.db"
    written = tmp / "written" if opts.kill_at_writes else None
    worker = WorkerSlot(address, queue, effects, scenario.doc_chars, env, written)
    await worker.start()
    samples: list[tuple[float, float]] = []
    background = [asyncio.create_task(_sample_rss(worker, samples))]
    if opts.kill_every:
        background.append(asyncio.create_task(_kill_every(worker, opts.kill_every)))
    if written is not None:
        background.append(asyncio.create_task(_kill_at_writes(worker, written)))
    # Far more than the turn needs: a turn that does not finish in it says so.
    budget = timedelta(seconds=max(600, 3 * scenario.steps))
    limits = TurnLimits(max_steps=scenario.steps + 1, max_duration=budget)
    print(
        f"long turn: {scenario.steps} steps of {scenario.doc_chars:,} characters…", file=sys.stderr
    )
    t0 = time.perf_counter()
    turn = await agents.start(
        QUESTION, agent=NAME, model=f"{MODEL_KIND}:{scenario.spec()}", limits=limits
    )
    try:
        result = await asyncio.wait_for(turn.result(), budget.total_seconds() + 120)
        wall = time.perf_counter() - t0
        end_rss = worker.rss_mb()
    finally:
        for task in background:
            task.cancel()
        worker.stop()

    handle = agents.temporal.get_workflow_handle(turn.id)
    histories = [
        await agents.temporal.get_workflow_handle(turn.id, run_id=run_id).fetch_history()
        for run_id, _ in await turns.runs(handle)
    ]
    ends = long_history.step_ends(histories, is_model)
    times = long_history.step_times(ends)
    early = long_history.median_ms(times, *scenario.early)
    late = long_history.median_ms(times, *scenario.late)
    rss_step = scenario.early[1]
    rss_by_step = {k: _rss_at(samples, ends[k]) for k in range(rss_step, len(ends), rss_step)}
    at_step = rss_by_step.get(rss_step)
    reads = [
        s.iteration
        for s in result.steps
        if s.kind is StepKind.OBSERVATION and s.observation and s.observation.tool == READ
    ]
    return {
        "workflow_id": turn.id,
        "outcome": result.outcome.value,
        "completed": result.answered,
        "answer": result.answer,
        "answer_uses_last_result": scenario.expected_answer in result.answer,
        "model_calls": result.usage.model_calls,
        "compactions": sum(s.kind is StepKind.COMPACT for s in result.steps),
        "wall_s": round(wall, 1),
        **long_history.sizes(histories),
        "payload_store_bytes": _folder_bytes(store),
        "step_ms": {"early": early, "late": late, "ratio": _ratio(late, early)},
        "step_breakdown_ms": {
            "early": long_history.breakdown(histories, is_model, *scenario.early),
            "late": long_history.breakdown(histories, is_model, *scenario.late),
        },
        "rss_mb": {"step": rss_step, "at_step": at_step, "end": end_rss},
        "rss_ratio": _ratio(end_rss, at_step),
        "rss_mb_by_step": rss_by_step,
        "history_by_event": long_history.by_event(histories),
        "steps_lost": sorted(set(range(1, scenario.steps + 1)) - set(reads)),
        "steps_repeated": sorted(n for n, c in Counter(reads).items() if c > 1),
        "writes": writes(effects, scenario),
        "kills": len(worker.kills),
    }


def writes(effects: Path, scenario: Scenario) -> dict[str, Any]:
    """The checkpoints in the file outside the worker: which steps wrote, how often."""
    if not effects.exists():
        return {"expected": len(scenario.write_steps), "written": 0, "attempts": 0}
    db = sqlite3.connect(effects)
    try:
        keys = [k for (k,) in db.execute("SELECT key FROM checkpoints")]
        attempts = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    finally:
        db.close()
    # A key is `<workflow id>/<iteration>/<call index>`: the step that wrote it.
    steps = Counter(int(k.rsplit("/", 2)[1]) for k in keys)
    return {
        "expected": len(scenario.write_steps),
        "written": len(keys),
        "attempts": attempts,
        "missing": sorted(set(scenario.write_steps) - set(steps)),
        "repeated": sorted(n for n, c in steps.items() if c > 1),
    }


def baseline(scenario: Scenario, effects: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    answer, times = plain_loop(scenario, effects)
    early = long_history.median_ms(times, *scenario.early)
    late = long_history.median_ms(times, *scenario.late)
    return {
        "answer_uses_last_result": scenario.expected_answer in answer,
        "wall_s": round(time.perf_counter() - t0, 2),
        "step_ms": {"early": early, "late": late, "ratio": _ratio(late, early)},
    }


async def run_peers(
    client: Client, address: str, scenario: Scenario, budget_s: float
) -> dict[str, Any]:
    try:
        peers.check_installed()
    except peers.PeersNotInstalled as e:
        print(f"peers left out: {e}", file=sys.stderr)
        return {}
    from durable_agent.bench.peers.long_peers import LONG_PEERS, run_peer

    out: dict[str, Any] = {}
    installed = peers.versions()
    for peer in LONG_PEERS:
        print(f"{peer.name}: the same turn, for at most {budget_s:.0f} s…", file=sys.stderr)
        out[peer.name] = {
            "versions": installed[peer.name],
            **await run_peer(client, peer, address, scenario, budget_s),
        }
    return out


async def _sample_rss(worker: WorkerSlot, samples: list[tuple[float, float]]) -> None:
    while True:
        rss = worker.rss_mb()
        if rss is not None:
            samples.append((time.time(), rss))
        await asyncio.sleep(RSS_EVERY_S)


async def _kill_every(worker: WorkerSlot, every_s: float, seed: int = 7) -> None:
    rng = random.Random(seed)
    while True:
        await asyncio.sleep(every_s * rng.uniform(*KILL_JITTER))
        await worker.kill_and_restart()


async def _kill_at_writes(worker: WorkerSlot, marker: Path) -> None:
    """SIGKILL the worker each time it has just written a checkpoint (it then hangs)."""
    while True:
        if marker.exists():
            marker.unlink()
            await worker.kill_and_restart()
        await asyncio.sleep(0.02)


def _rss_at(samples: list[tuple[float, float]], when: float) -> float | None:
    """The sample taken nearest to `when` (a step's end)."""
    if not samples:
        return None
    return min(samples, key=lambda sample: abs(sample[0] - when))[1]


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# -- the report ---------------------------------------------------------------------------


def checks(r: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    """(what, value, target, PASS / MISS and the gap) for every target of the run."""
    a = r["agent"]
    killed = bool(r["scenario"]["kill_every_s"] or r["scenario"].get("kill_at_writes"))
    out = [
        ("completed", a["outcome"], "answered", _verdict(a["completed"])),
        (
            "answer quotes the last result",
            a["answer_uses_last_result"],
            "yes",
            _verdict(a["answer_uses_last_result"]),
        ),
        (
            "history bytes, all runs (JSON)",
            a["history_bytes_json"],
            f"< {TARGETS['history_bytes']:,}",
            _below(a["history_bytes_json"], TARGETS["history_bytes"]),
        ),
        (
            "history bytes, all runs (server)",
            a["history_bytes"],
            f"< {TARGETS['history_bytes']:,}",
            _below(a["history_bytes"], TARGETS["history_bytes"]),
        ),
        (
            "history events, all runs",
            a["history_events"],
            f"< {TARGETS['history_events']:,}",
            _below(a["history_events"], TARGETS["history_events"]),
        ),
    ]
    early, late = r["scenario"]["early_steps"], r["scenario"]["late_steps"]
    step = a["step_ms"]
    rss = a["rss_mb"]
    if killed:
        out += [
            ("step time ratio", step["ratio"], "— (killed workers)", "—"),
            ("worker RSS ratio", a["rss_ratio"], "— (killed workers)", "—"),
        ]
    else:
        out += [
            (
                f"step time, median steps {late[0]}–{late[1]} / {early[0]}–{early[1]} (ms)",
                f"{step['late']} / {step['early']} = {step['ratio']}",
                f"<= {TARGETS['step_time_ratio']}",
                _at_most(step["ratio"], TARGETS["step_time_ratio"]),
            ),
            (
                f"worker RSS, end / step {rss['step']} (MB)",
                f"{rss['end']} / {rss['at_step']} = {a['rss_ratio']}",
                f"<= {TARGETS['rss_ratio']}",
                _at_most(a["rss_ratio"], TARGETS["rss_ratio"]),
            ),
        ]
    w = a["writes"]
    out += [
        (
            "steps lost / repeated",
            f"{len(a['steps_lost'])} / {len(a['steps_repeated'])}",
            "0 / 0",
            _verdict(not a["steps_lost"] and not a["steps_repeated"]),
        ),
        (
            f"checkpoints written once ({w['attempts']} attempts)",
            f"{w['written']} of {w['expected']}",
            f"{w['expected']}, none twice",
            _verdict(
                w["written"] == w["expected"] and not w.get("repeated") and not w.get("missing")
            ),
        ),
    ]
    return out


def report(r: dict[str, Any]) -> str:
    """The systems side by side, the agent's step parts, then every target's verdict."""
    a, loop, sc = r["agent"], r["plain_loop"], r["scenario"]
    head = (
        f"long turn: {sc['steps']} steps, documents of {sc['doc_chars']:,} characters, "
        f"a checkpoint every {sc['write_every']} steps"
    )
    if sc["kill_every_s"] or sc.get("kill_at_writes"):
        when = [f"about every {sc['kill_every_s']:g} s"] if sc["kill_every_s"] else []
        when += ["right after each checkpoint's write"] if sc.get("kill_at_writes") else []
        head += f", the worker SIGKILLed {' and '.join(when)} ({a['kills']} kills)"
    lines = [head, "settings: " + ", ".join(f"{k} {v}" for k, v in r["settings"].items()), ""]
    early, late = _span(sc["early_steps"]), _span(sc["late_steps"])
    systems: dict[str, dict[str, Any]] = {
        "agent": {**a, "steps_done": sc["steps"] - len(a["steps_lost"]), "why": a["outcome"]},
        "plain loop": {**loop, "steps_done": sc["steps"]},
        **r["peers"],
    }
    rows: list[tuple[str, Any]] = [
        ("steps done", lambda s: s.get("steps_done")),
        ("wall time (s)", lambda s: s.get("wall_s")),
        (f"step time, median steps {early} (ms)", lambda s: _step(s, "early")),
        (f"step time, median steps {late} (ms)", lambda s: _step(s, "late")),
        ("runs", lambda s: s.get("runs")),
        ("conversation summarised (times)", lambda s: s.get("compactions")),
        ("history events", lambda s: s.get("history_events")),
        ("history bytes (server)", lambda s: s.get("history_bytes")),
        ("history bytes (JSON)", lambda s: s.get("history_bytes_json")),
        ("payload store bytes", lambda s: s.get("payload_store_bytes")),
    ]
    lines.append(f"{'':40}" + "".join(f"{name:>16}" for name in systems))
    for label, get in rows:
        lines.append(f"{label:40}" + "".join(f"{_n(get(s)):>16}" for s in systems.values()))
    for name, s in systems.items():
        if s.get("why"):
            lines.append(f"  {name}: {s['why']}")
    for window in ("early", "late"):
        parts = ", ".join(f"{k} {v}" for k, v in a["step_breakdown_ms"][window].items())
        lines.append(f"agent's step parts, steps {_span(sc[window + '_steps'])} (ms): {parts}")
    lines += ["", f"{'target':52} {'value':>28}   {'wanted':>18}   verdict"]
    lines += [
        f"{name:52} {str(value):>28}   {target:>18}   {verdict}"
        for name, value, target, verdict in checks(r)
    ]
    return "\n".join(lines)


def _step(system: dict[str, Any], window: str) -> float | None:
    if "step_ms" in system:
        return system["step_ms"][window]  # type: ignore[no-any-return]
    return system.get(f"step_ms_{window}")


def _span(steps: list[int]) -> str:
    return f"{steps[0]}–{steps[1]}"


def _n(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _below(value: float, target: float) -> str:
    return "PASS" if value < target else f"MISS by {value - target:,.0f} ({value / target:.2f}×)"


def _at_most(value: float | None, target: float) -> str:
    if value is None:
        return "MISS (not measured)"
    return (
        "PASS"
        if value <= target
        else f"MISS by {value - target:.2f} ({(value / target - 1) * 100:.0f} % over)"
    )
