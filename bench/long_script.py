"""The long turn's scenario, as plain decisions every system's model and tools wrap.

A reader goes through documents 1..`steps`, one per round, each `doc_chars` long;
every `write_every` rounds it also saves a checkpoint (a write); then it answers with
the last document's last word, which names the document (`end-of-doc-N`). The next
document is the one after the last read it asked for (its own call, not a count of
the results it holds: a conversation whose old results were shortened or summed up
still says which call came last).
"""

from __future__ import annotations

from dataclasses import dataclass

READ = "read_doc"
WRITE = "save_checkpoint"
QUESTION = "Read the documents one by one, then tell me how the last one ends."


@dataclass(frozen=True)
class Scenario:
    steps: int = 1000
    doc_chars: int = 20_000
    write_every: int = 100
    """A checkpoint every this many documents (0: none)."""
    window: int = 128_000
    """The model's context window in tokens: gpt-4o's by default; a smaller one (a
    local model's 32,000) makes the turn shorten and summarise far more often."""

    def next_doc(self, last_read: int | None) -> int | None:
        """The document to read after `last_read` (None: none read yet); None when
        every one has been read (time to answer)."""
        n = 1 if last_read is None else last_read + 1
        return n if n <= self.steps else None

    def writes_at(self, n: int) -> bool:
        return bool(self.write_every) and n % self.write_every == 0

    @property
    def write_steps(self) -> list[int]:
        """The rounds whose calls include a checkpoint."""
        return [n for n in range(1, self.steps + 1) if self.writes_at(n)]

    @property
    def expected_answer(self) -> str:
        return last_word(doc(self.steps, self.doc_chars))

    @property
    def early(self) -> tuple[int, int]:
        """The steps the early step time is the median of: 10–100 of 1,000, the same
        share of another number."""
        return max(1, self.steps // 100), max(1, self.steps // 10)

    @property
    def late(self) -> tuple[int, int]:
        """The steps the late step time is the median of: 900–1,000 of 1,000."""
        return max(1, self.steps - self.steps // 10), self.steps

    def spec(self) -> str:
        """The scenario as a model spec's argument (`steps:write_every:window`)."""
        return f"{self.steps}:{self.write_every}:{self.window}"

    @classmethod
    def from_spec(cls, spec: str, doc_chars: int = 20_000) -> Scenario:
        steps, _, rest = spec.partition(":")
        every, _, window = rest.partition(":")
        return cls(
            steps=int(steps),
            doc_chars=doc_chars,
            write_every=int(every or 0),
            window=int(window or 128_000),
        )


def doc(n: int, chars: int) -> str:
    """Document `n`: `chars` characters of words of its own, its last word naming it."""
    end = f"end-of-doc-{n}"
    words: list[str] = []
    size = 0
    i = 0
    while size < chars - len(end) - 1:
        word = f"d{n}w{i}"
        words.append(word)
        size += len(word) + 1
        i += 1
    body = " ".join(words)[: max(0, chars - len(end) - 1)].rstrip()
    return f"{body} {end}" if body else end


def last_word(text: str) -> str:
    return text.rsplit(maxsplit=1)[-1] if text.strip() else ""


def answer(last_result: str) -> str:
    """The answer: it quotes the last document's last word."""
    return f"The last document ends with {last_word(last_result)}."
