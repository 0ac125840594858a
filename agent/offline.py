"""The offline model: a deterministic stand-in for an LLM.

No network, no weights, no key. It is not intelligent; it is predictable, which
is what a demo on a fresh machine and a test suite need. It reads only what a
real model would be given (the question, the tool specs, the observations):

- plan: extracts argument values from the question with the patterns of the
  tools' JSON schemas (`order_id` ~ `\\d{6}`), and scores each tool by how many
  of the question's content words appear in the tool's description, argument
  descriptions and examples. A question whose words are mostly off the tools'
  topics ("the weather in Scotland", "the impact of return rtn001 on world
  peace") is declined. A topical question with a missing id gets asked for it.
- interpret: answers with the text of the results of its last calls, in call
  order (tool errors included, so an unknown order reads "Order not found.
  Please check your Order ID.").

Token usage is estimated from word counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.answers import DECLINE
from agent.argfill import Param, fill_arguments, required_params
from agent.conversation import calls_so_far, latest_results
from agent.model import ModelRequest, Reply
from agent.tools import ToolSpec
from agent.types import ToolCall, Usage

# The share of the question's content words a tool's vocabulary must cover.
MIN_COVERAGE = 0.5

STOPWORDS = frozenset(
    [
        "a",
        "about",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "being",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "for",
        "from",
        "had",
        "has",
        "have",
        "hello",
        "hey",
        "hi",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "just",
        "me",
        "my",
        "now",
        "of",
        "on",
        "or",
        "our",
        "please",
        "right",
        "so",
        "tell",
        "than",
        "thanks",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "this",
        "those",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
    ]
)


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    # "shipped" -> "shipp" and "shipping" -> "shipp" meet; collapse the double letter too.
    if len(word) > 3 and word[-1] == word[-2]:
        word = word[:-1]
    return word


def content_words(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [_stem(w) for w in words if w not in STOPWORDS and not any(c.isdigit() for c in w)]


@dataclass(frozen=True)
class _ToolProfile:
    spec: ToolSpec
    params: tuple[Param, ...]
    vocabulary: frozenset[str]

    @classmethod
    def of(cls, spec: ToolSpec) -> _ToolProfile:
        params = required_params(spec)
        text = " ".join(
            [spec.name.replace("_", " "), spec.description, *spec.examples]
            + [p.description for p in params]
        )
        return cls(spec, tuple(params), frozenset(content_words(text)))

    @property
    def needs_id(self) -> bool:
        return any(p.pattern is not None for p in self.params)

    def id_values(self, args: dict[str, str]) -> tuple[str, ...]:
        return tuple(args[p.name].lower() for p in self.params if p.pattern is not None)

    def fill(self, question: str) -> dict[str, str] | None:
        return fill_arguments(self.params, question)

    def coverage(self, words: list[str]) -> float:
        return sum(w in self.vocabulary for w in words) / len(words) if words else 0.0


def _pick_id_tools(
    profiles: list[_ToolProfile], question: str, words: list[str]
) -> list[tuple[_ToolProfile, dict[str, str]]]:
    """Tools whose ids all appear in the question, one per set of ids.

    Tools taking the same ids (order_status and start_return both take an order
    id) compete: the one covering more of the question's words wins, the first
    registered on a tie. Words another id's tool explains don't count ("has order
    123456 shipped and is return rtn001 processed": "return" belongs to rtn001).
    """
    groups: dict[tuple[str, ...], list[tuple[_ToolProfile, dict[str, str]]]] = {}
    for p in profiles:
        if p.needs_id and (args := p.fill(question)):
            groups.setdefault(p.id_values(args), []).append((p, args))

    def best(ids: tuple[str, ...], counted: list[str]) -> tuple[_ToolProfile, dict[str, str]]:
        return max(groups[ids], key=lambda pa: pa[0].coverage(counted))

    chosen = {ids: best(ids, words) for ids in groups}
    for ids in groups:
        others = frozenset().union(*(p.vocabulary for i, (p, _) in chosen.items() if i != ids))
        chosen[ids] = best(ids, [w for w in words if w not in others] or words)
    return list(chosen.values())


def _usage(prompt: str, reply: str) -> Usage:
    return Usage(model_calls=1, input_tokens=len(prompt.split()), output_tokens=len(reply.split()))


class OfflineModel:
    """Deterministic, offline, keyword-and-pattern model. See the module docstring."""

    provider = "offline"
    name = "offline-keyword-v1"

    def __init__(self) -> None:
        self._profiles: dict[str, _ToolProfile] = {}

    def _profile(self, spec: ToolSpec) -> _ToolProfile:
        key = spec.model_dump_json()
        if key not in self._profiles:
            self._profiles[key] = _ToolProfile.of(spec)
        return self._profiles[key]

    async def plan(self, request: ModelRequest) -> Reply:
        question = request.question
        profiles = [self._profile(s) for s in request.tools]
        words = content_words(question)
        prompt = question + " " + " ".join(s.description for s in request.tools)
        first_id = calls_so_far(request.messages) + 1

        def calls(chosen: list[tuple[_ToolProfile, dict[str, str]]]) -> Reply:
            made = [
                ToolCall(id=f"call_{first_id + i}", name=p.spec.name, arguments=args)
                for i, (p, args) in enumerate(chosen)
            ]
            return Reply(calls=made, usage=_usage(prompt, " ".join(c.render() for c in made)))

        def say(text: str) -> Reply:
            return Reply(text=text, usage=_usage(prompt, text))

        with_ids = _pick_id_tools(profiles, question, words)
        if with_ids:
            vocabulary = frozenset().union(*(p.vocabulary for p, _ in with_ids))
            covered = sum(w in vocabulary for w in words) / len(words) if words else 1.0
            return calls(with_ids) if covered >= MIN_COVERAGE else say(DECLINE)

        # No ids: the best topical tool, asking for a missing id, or decline.
        ranked = sorted(profiles, key=lambda p: p.coverage(words), reverse=True)
        best = ranked[0] if ranked else None
        if best is None or best.coverage(words) < MIN_COVERAGE:
            return say(DECLINE)
        if best.needs_id:
            missing = next(p for p in best.params if p.pattern is not None)
            return say(f"I can look that up. Please tell me the {missing.description}.")
        return calls([(best, best.fill(question) or {})])

    async def interpret(self, request: ModelRequest) -> Reply:
        results = latest_results(request.messages)
        found = [r.text for r in results if r.ok]
        failed = [r.text for r in results if not r.ok]
        answer = " ".join(found + failed) or DECLINE
        prompt = request.question + " " + " ".join(found + failed)
        return Reply(text=answer, usage=_usage(prompt, answer))
