"""The offline model: a deterministic stand-in for an LLM. It is not a language model.

It is a set of word rules: no network, no weights, no key, and
the same answer every time, which is what a demo on a fresh machine and a test
suite need. It reads only what a real model would be given: the conversation
(the customer's messages, its own earlier messages, the tool results as
rendered text) and the tool specs (name, description, JSON schema, examples).
It knows nothing of the shop's code or data, only some English: a handful of
synonyms ("cost" ~ "total"), what a question looks like, and how to phrase a
record's fields ("Shipped on", "Expected delivery") in a sentence.

Before it reads a message it puts right typos of the words it knows ("wher is my
ordr" -> "where is my order"), and words of feeling ("where the hell is ...") are
not what a message asks (they make the answer say sorry).

plan, in this order:
- a question with files (`durable_agent/attachments.py`) is answered from them alone:
  the sentences of its documents (text files, PDFs' text layer) that share the most
  words with it, each with its file's name; of images, that it cannot see them;
- small talk ("hi", "thanks", "what can you do?") gets a greeting that lists
  what the tools do;
- a reply to its own question completes the request it asked about: an id
  ("123456" after "please tell me the order ID") or a reason ("it arrived
  damaged" after "tell me why the item goes back");
- ids come from the question (the schemas' `pattern`s); a question that
  refers back ("when will it arrive?") takes them from the conversation, from
  the latest message that names one;
- tools are scored by the question's content words their description,
  argument descriptions and examples cover; a tool whose examples are all
  requests, not questions (`start_return`), is only picked for an explicit
  request that says its action word ("I want to return order 123456, the soap
  is broken"), never for a question about it ("Can I return order 123456?");
- words an id lookup leaves unexplained go to a tool without ids in the same
  reply, so they run in parallel ("Can I return order 123456?" -> the order and
  the return policy);
- a question the tools cover less than half of is declined; a missing id or
  reason is asked for;
- a number shaped like an id's example that is not one ("order 12345") is said to
  be none, with the customer's list when a tool lists them; "which one of those" reads
  the list the last answer named again; a message about something of theirs without
  an id ("my package never came") lists them when the phrasebook says the list finds
  it (`Phrasebook.list_finds`).

Never a write for a question or a request to be shown something: a tool that writes
(`ToolSpec.side_effects`) is called only for a request that says its action. And
never a call its schema would refuse: a value it cannot make of the message (a list,
a number, text over `maxLength`) gets a polite answer saying what the call needs, and
a refused call it reads back is said in words, never as the schema's message.

interpret parses the results' `Key: value.` sentences back into records and
composes a short answer for the kind of question: yes/no with dates for
shipping, the amount for totals, the item, a return's status and next step,
the best policy document's sentences. Tool errors are passed on as they are.
In a typed turn (the output tool offered) it gives the value instead: the type's
fields filled by name from the records of the latest results (`fill`).

What it is not: it does not understand language. Paraphrases far from the
tools' words are declined or misread, and a question it cannot parse gets the
records' own words. Real models plug in behind the same interface.

Token usage is estimated from word counts.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from durable_agent import attachments
from durable_agent.answers import decline_text, handoff_text
from durable_agent.argfill import (
    QUOTED,
    Param,
    find_id,
    find_reason,
    find_value,
    id_noun,
    required_params,
)
from durable_agent.argfill import (
    find_ids as find_all_ids,
)
from durable_agent.compaction import digest
from durable_agent.context_sources import SEARCH_TOOL, passages_in
from durable_agent.conversation import (
    AssistantMessage,
    Message,
    ToolResult,
    UserMessage,
    calls_so_far,
    latest_results,
)
from durable_agent.model import ModelRequest, Reply
from durable_agent.shields import DATA_MARK
from durable_agent.shields.offline import reads_as_instructions
from durable_agent.stream import TextSink, write_out
from durable_agent.tools import ToolSpec, is_refused_call
from durable_agent.types import ToolCall, Usage

# The share of the question's content words a tool's vocabulary must cover; a
# third is enough when the question leads with a word the tool knows ("Can I
# *return* opened soap?").
MIN_COVERAGE = 0.5
MIN_LEAD_COVERAGE = 1 / 3
# A word that only matches through a synonym counts half when ranking tools:
# "total" is an order's own word, "cost" a policy's.
SYNONYM_WEIGHT = 0.5

# --- words ----------------------------------------------------------------------------


def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _wordset(
    """a about also am an and any are as ask at be been being by can could d did didn do does
    doesn doing don for from get got had has hasn have haven hello hey hi how i if in into is
    isn it its just know let like ll m may me might my need no not now of ok okay on one or our
    please re right s see so t tell than thank thanks that the their them then there these
    this those to ve want was wasn we were what when where which who whom why will with won wonder
    would yes you your yours"""
)

ENGLISH = {
    "amount": "amount charge cost much paid pay price spend spent total",
    "item": "bought buy item product purchase thing",
    "quantity": "many quantity unit",
    "status": "going happen status update",
}
"""Words an LLM knows mean the same thing, by concept. An agent's phrasebook adds the
words of its own domain (`Phrasebook.synonyms`)."""


def _stem(word: str) -> str:
    """A crude stemmer that makes the forms of one word meet ("shipped",
    "shipping", "ships" -> "ship"; "policies", "policy" -> "polic")."""
    for suffix in ("ations", "ation", "ings", "ing", "ies", "ied", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            break
    consonant_y = len(word) > 4 and word.endswith("y") and word[-2] not in "aeiou"
    if consonant_y or (len(word) > 3 and word.endswith("e")):
        word = word[:-1]
    if len(word) > 3 and word[-1] == word[-2]:
        word = word[:-1]
    return word


class Vocabulary:
    """Concepts and the word stems that say them."""

    def __init__(self, synonyms: Mapping[str, str]) -> None:
        self.concept_of = {_stem(w): c for c, ws in synonyms.items() for w in ws.split()}

    def concepts(self, words: Iterable[str]) -> set[str]:
        return {self.concept_of[w] for w in words if w in self.concept_of}


def _normalize(text: str) -> str:
    """Lower case, and "send (it) back" said as the one word it means."""
    text = text.lower().replace("\u2019", "'")
    return re.sub(r"\bsend(?:ing)?\s+(?:it\s+|them\s+|this\s+|that\s+)?back\b", "return", text)


FEELINGS = _wordset(
    """angry annoyed annoying awful bloody crap damn damned dammit disgusting ever fed freaking
    fricking frustrated frustrating fuck fucking furious heck hell horrible joke kidding
    literally omg outrageous pathetic ridiculous rubbish seriously shit sick terrible tired
    unacceptable upset useless worst wtf"""
)
"""Words that say how the customer feels, not what they ask: "where the hell is my order
123456, this is ridiculous" asks where order 123456 is."""


def content_words(text: str) -> list[str]:
    """The stems of the words that say what a text is about (no ids, no filler, no
    feelings)."""
    words = re.findall(r"[a-z0-9]+", _normalize(text))
    return [
        _stem(w)
        for w in words
        if len(w) > 1
        and w not in STOPWORDS
        and w not in FEELINGS
        and not any(c.isdigit() for c in w)
    ]


def is_upset(text: str) -> bool:
    """Whether the message says the customer is upset: words of feeling, "!!", or
    shouting (mostly capitals) with an exclamation mark."""
    letters = [c for c in text if c.isalpha()]
    shouting = len(letters) >= 12 and sum(c.isupper() for c in letters) > 0.6 * len(letters)
    feeling = any(w in FEELINGS for w in re.findall(r"[a-z]+", text.lower()))
    return feeling or (shouting and "!" in text) or "!!" in text


class Spelling:
    """Typos of the words the model knows, put right before it reads a message: "wher
    is my ordr 123456??" reads as "where is my order 123456??". A word it knows (or
    whose stem it knows), a short word and one with digits stay as they are. A typo is
    one letter left out, two swapped, or a letter doubled, and is put right only when
    one known word (by stem) is that close. A wrong letter is never guessed: it turns
    real words into others ("world" would read "would", "change" "charge")."""

    MIN_LENGTH = 4

    def __init__(self, known: Iterable[str]) -> None:
        self.known = frozenset(w for w in known if w.isalpha())
        # A filler word is known as it is written: "wher" is not "where".
        self.stems = frozenset(_stem(w) for w in self.known if w not in STOPWORDS)
        self.by_length: dict[int, list[str]] = {}
        for w in sorted(self.known):
            if len(w) >= self.MIN_LENGTH:
                self.by_length.setdefault(len(w), []).append(w)

    def text(self, text: str) -> str:
        return re.sub(r"(?<![\w'-])[A-Za-z]+(?![\w'-])", lambda m: self.word(m.group(0)), text)

    def word(self, word: str) -> str:
        lower = word.lower()
        if len(lower) < self.MIN_LENGTH or lower in self.known or _stem(lower) in self.stems:
            return word
        for kind in (_left_out, _swapped, _doubled):
            near = {k for n in (-1, 0, 1) for k in self.by_length.get(len(lower) + n, ())}
            found = sorted(k for k in near if kind(lower, k))
            if len({_stem(k) for k in found}) == 1:
                return found[0]
            if found:
                return word  # two words are as close: no guess
        return word


def _left_out(typed: str, known: str) -> bool:
    return len(known) == len(typed) + 1 and any(
        known[:i] + known[i + 1 :] == typed for i in range(len(known))
    )


def _swapped(typed: str, known: str) -> bool:
    if len(known) != len(typed):
        return False
    diff = [i for i in range(len(typed)) if typed[i] != known[i]]
    return (
        len(diff) == 2
        and diff[1] == diff[0] + 1
        and typed[diff[0]] == known[diff[1]]
        and typed[diff[1]] == known[diff[0]]
    )


def _doubled(typed: str, known: str) -> bool:
    return len(typed) == len(known) + 1 and any(
        typed[i] == typed[i + 1] and typed[:i] + typed[i + 1 :] == known
        for i in range(len(typed) - 1)
    )


# --- what the customer's message looks like ---------------------------------------------

_LEAD_IN = re.compile(
    r"^(?:\s*(?:hi|hello|hey|ok|okay|so|and|also|well|thanks|thank you)\b[\s,!.]*)+"
)
_POLITE_REQUEST = re.compile(
    r"^(?:please|kindly|(?:can|could|would|will) you|i want|i'd like|i would like|i need"
    r"|i wish|go ahead)\b"
)
_ASKS_ABOUT = re.compile(
    r"\b(?:whether|if i|can i|could i|may i|should i|am i|is it possible|what happens"
    r"|what if|how do i|how can i|do i|know if|tell me if|wonder)\b"
)
_ASKS_YES_OR_NO = re.compile(
    r"^(?:please |(?:can|could|would|will) you (?:please )?)?"
    r"(?:tell me |let me know |check )(?:if|whether)\b"
)
_INTERROGATIVES = _wordset(
    """am are can could did do does had has have how is may might shall should was were
    what when where which who whom whose why will would"""
)
_AUXILIARIES = _INTERROGATIVES - _wordset("how what when where which who whom whose why")


def _opening(text: str) -> str:
    """The message in lower case, without a greeting or "ok, so" in front."""
    return _LEAD_IN.sub("", _normalize(text).strip())


def _first_word(text: str) -> str:
    m = re.match(r"[a-z']+", _opening(text))
    return m.group(0) if m else ""


def is_question(text: str) -> bool:
    """A question (about returning, say), as opposed to a request to do something.
    "Can you start a return ...?" is a polite request; "Can I return ...?" asks."""
    opening = _opening(text)
    if _ASKS_ABOUT.search(opening):
        return True
    if _POLITE_REQUEST.match(opening):
        return False
    return "?" in text or _first_word(text) in _INTERROGATIVES


_READ_VERBS = _wordset(
    """browse check describe display explain fetch find list look print read search see
    show tell view"""
)
"""Verbs that ask to be shown something: a request that leads with one asks nothing to
change ("Show me everything in the knowledge graph")."""
_ASKING = re.compile(
    r"^(?:(?:please|kindly|just|(?:can|could|would|will) you|i want(?: to)?|i'd like(?: to)?"
    r"|i would like(?: to)?|i need(?: to)?|let me|help me|go ahead and)\s+)+"
)


def asks_to_change(text: str) -> bool:
    """Whether the message asks for something to be done, as opposed to a question or a
    request to be shown something ("show me ...", "list ...", "can you find ...")."""
    if is_question(text):
        return False
    return lead_verb(text) not in _READ_VERBS


def lead_verb(text: str) -> str:
    """The word a request leads with, after "please", "can you", "I want to"."""
    verb = re.match(r"[a-z']*", _ASKING.sub("", _opening(text)))
    return verb.group(0) if verb else ""


def is_yes_no(text: str) -> bool:
    """Whether the question wants a yes or a no first ("Has order 123456 shipped?"),
    unlike "When ...?"."""
    return bool(_ASKS_YES_OR_NO.match(_opening(text))) or _first_word(text) in _AUXILIARIES


_IT = re.compile(r"\b(?:it|its|that one|this one)\b")
_DUMMY_IT = re.compile(
    r"\b(?:is it|it is|it's|was it|it was) (?:possible|true|ok|okay|allowed|free|necessary"
    r"|worth|too late|going to)\b"
)
_ABOUT_MINE = re.compile(r"\b(?:did i|have i|had i|i paid|i ordered|i bought|i purchased)\b")
_HOW_TO = re.compile(r"\bhow (?:do|can|could|should|would) (?:i|we)\b")


def refers_back(text: str, nouns: Iterable[str]) -> bool:
    """Whether the message is about a specific thing it does not name: "it",
    "my order", "how much did I pay?". Not "how do I cancel my order?", which
    asks how things are done."""
    t = _DUMMY_IT.sub(" ", _normalize(text))
    if _HOW_TO.search(t):
        return False
    if _IT.search(t) or _ABOUT_MINE.search(t):
        return True
    return any(re.search(rf"\b(?:my|this|that|our) {re.escape(n)}s?\b", t) for n in nouns)


_SMALL_TALK = _wordset(
    """a afternoon alright are bye can cheers could day do evening fine good goodbye great
    greetings hello help hey hi hiya how i lot me mind morning much never nevermind nice no
    nope ok okay please so thank thanks there thx very what you"""
)
_THANKS = _wordset("thank thanks thx cheers")
_BYE = _wordset("bye goodbye")
_NO = _wordset("never nevermind no nope")
_OK = _wordset("alright fine ok okay")


def is_small_talk(text: str) -> bool:
    words = re.findall(r"[a-z0-9]+", _normalize(text))
    return bool(words) and all(w in _SMALL_TALK for w in words)


_OTHER_LANGUAGES = {
    "Spanish": "hola el la los las del mi mis pedido pedidos dónde donde está esta cuándo cuando "
    "qué que por favor quiero gracias devolver llegado llegó todavía aún reembolso dinero un "
    "una es con para mí",
    "German": "hallo wo ist meine mein bestellung bestellungen wann kommt ich möchte zurückgeben "
    "danke bitte die der das und nicht noch geld zurück habe hat paket angekommen meiner",
    "French": "bonjour où est ma mon mes commande commandes quand je veux retourner merci le la "
    "les une des pas encore colis arrivé remboursement argent suis avec pour",
    "Italian": "ciao dov è il mio ordine ordini quando voglio restituire grazie non ancora pacco "
    "arrivato rimborso soldi della per",
    "Portuguese": "olá onde está meu minha pedido pedidos quando quero devolver obrigado obrigada "
    "não ainda chegou reembolso dinheiro encomenda",
    "Dutch": "hallo waar is mijn bestelling bestellingen wanneer ik wil terugsturen dank bedankt "
    "niet nog pakket aangekomen geld terug het een",
}
"""A few common words of the languages a customer may write in instead: the offline
model reads only English, and says so."""
_LANGUAGE_WORDS = {lang: _wordset(words) for lang, words in _OTHER_LANGUAGES.items()}
_ENGLISH_ONLY = frozenset(
    w for w in STOPWORDS if not any(w in ws for ws in _LANGUAGE_WORDS.values())
)


def other_language(text: str) -> str | None:
    """The language a message is in, when it is one of `_OTHER_LANGUAGES` and not
    English: more of its words are that language's than English's, at least two."""
    words = re.findall(r"[^\W\d_]+", text.lower())
    english = sum(w in _ENGLISH_ONLY for w in words)
    best, hits = max(
        ((lang, sum(w in ws for w in words)) for lang, ws in _LANGUAGE_WORDS.items()),
        key=lambda found: found[1],
    )
    return best if hits >= 2 and hits > english else None


ONLY_ENGLISH = "I'm sorry, I can only read English so far (your message looks like {language})."


# --- the tools, as the model sees them ---------------------------------------------------


@dataclass(frozen=True)
class _ToolProfile:
    spec: ToolSpec
    params: tuple[Param, ...]
    vocabulary: frozenset[str]
    request_only: bool
    """A tool that does something (start a return), called only when the customer asks
    for it to be done: one that writes (`ToolSpec.side_effects`), or whose every example
    is a request, none a question."""
    action_words: frozenset[str]
    """The words of the tool's name every example says ("return"), or for a write with
    no examples its name's verb ("create" of create_entities): a request for the tool
    says one of them."""
    vocabulary_concepts: frozenset[str]
    words: Vocabulary

    @classmethod
    def of(cls, spec: ToolSpec, words: Vocabulary) -> _ToolProfile:
        params = required_params(spec)
        text = " ".join(
            [spec.name.replace("_", " "), spec.description, *spec.examples]
            # A parameter's quoted examples ('Asia/Tokyo') are not what the tool is about.
            + [QUOTED.sub("", p.description) for p in params]
        )
        # The tool's own name, without its server's (memory__create_entities).
        own_name = [w for w in re.split(r"[_\W]+", spec.name.rsplit("__", 1)[-1]) if w] or [""]
        name_words = set(content_words(" ".join(own_name)))
        if spec.examples:
            action = name_words.intersection(*(content_words(e) for e in spec.examples))
        else:
            action = set(content_words(own_name[0]) if spec.side_effects else name_words)
        requests = bool(spec.examples) and not any("?" in e for e in spec.examples)
        request_only = spec.side_effects or requests
        vocabulary = frozenset(content_words(text))
        known = frozenset(words.concepts(vocabulary))
        return cls(spec, params, vocabulary, request_only, frozenset(action), known, words)

    @property
    def ids(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_id)

    @property
    def reason(self) -> Param | None:
        return next((p for p in self.params if p.is_reason), None)

    def matches(self, word: str) -> float:
        if word in self.vocabulary:
            return 1.0
        concept = self.words.concept_of.get(word)
        return SYNONYM_WEIGHT if concept in self.vocabulary_concepts else 0.0

    def score(self, words: Sequence[str]) -> float:
        return sum(self.matches(w) for w in words)

    def coverage(self, words: Sequence[str]) -> float:
        return sum(self.matches(w) > 0 for w in words) / len(words) if words else 0.0

    def find_ids(self, text: str) -> dict[str, str] | None:
        """This tool's ids in `text`, or None unless all of them are there."""
        found = {p.name: find_id(p.pattern, text) for p in self.ids if p.pattern}
        return None if None in found.values() else {k: v for k, v in found.items() if v}

    def each_id(self, text: str) -> list[dict[str, str]]:
        """A call's ids for each id in `text`, for a tool that takes one ("orders
        123456 and 234567": two calls); the one set `find_ids` finds otherwise."""
        (only,) = self.ids if len(self.ids) == 1 else (None,)
        if only is not None and only.pattern is not None:
            return [{only.name: v} for v in find_all_ids(only.pattern, text)]
        found = self.find_ids(text)
        return [found] if found else []

    def allowed(self, request: bool, words: Sequence[str]) -> bool:
        """Tools that do something need an explicit request naming their action."""
        if not self.request_only:
            return True
        return request and (not self.action_words or bool(self.action_words & set(words)))

    def phrase(self) -> str:
        """The tool's name as words, for offering it: start_return -> "start a return",
        time__get_current_time (a tool server's) -> "get current time"."""
        words = [w for w in re.split(r"[_\W]+", self.spec.name.rsplit("__", 1)[-1]) if w]
        if len(words) == 2 and not words[1].endswith("s"):
            return f"{words[0]} {'an' if words[1][0] in 'aeiou' else 'a'} {words[1]}"
        return " ".join(words)


def _capability(spec: ToolSpec) -> str:
    """What a tool does, from the opening of its description. Asides in parentheses go
    first: "Whether a service (email, vpn) is up" is "whether a service is up", and an
    aside cut open at its comma would offer its words as if they were the customer's."""
    text = re.sub(r"\s*\([^)]*\)", "", " ".join(spec.description.split()))
    text = re.split(r"[:,.(]", text, maxsplit=1)[0].strip()
    return text[:1].lower() + text[1:]


Choice = tuple[_ToolProfile, dict[str, str]]

# --- the conversation -------------------------------------------------------------------

ASK = "Please tell me"
"""How the model asks for what it is missing. It knows its own asks again by
"tell me" and the description of the argument it asked for."""


def _asked_for(text: str, profiles: Sequence[_ToolProfile]) -> tuple[_ToolProfile, Param] | None:
    """The tool and parameter one of the model's own messages asked the customer for."""
    lowered = text.lower()
    if "tell me" not in lowered:
        return None
    for p in profiles:
        for param in p.params:
            if param.description.rstrip(".").lower() in lowered:
                return p, param
    return None


@dataclass(frozen=True)
class _Dialogue:
    """The conversation as the model reads it."""

    question: str
    """The customer's request: the latest message, completed by the earlier one
    when it only answers the model's question for an id ("123456"), typos put right."""
    earlier: tuple[str, ...]
    """What was said before that (customer and model), latest first."""
    last_ask: tuple[_ToolProfile, Param] | None
    """What the model's previous message asked the customer for, if anything."""
    said: str = ""
    """The request as the customer wrote it: what a call's free text is made of."""

    @classmethod
    def of(
        cls,
        messages: Sequence[Message],
        profiles: Sequence[_ToolProfile],
        spelling: Spelling | None = None,
    ) -> _Dialogue:
        said = [m for m in messages if not isinstance(m, ToolResult)]
        last = max((i for i, m in enumerate(said) if isinstance(m, UserMessage)), default=-1)
        if last < 0:
            return cls("", (), None)
        question = said[last].text
        last_ask = _own_ask(said[last - 1], profiles) if last > 0 else None
        start = last
        asked_for_id = last_ask is not None and last_ask[1].is_id
        if asked_for_id and last >= 2 and not is_question(question):
            start = last - 2  # "123456" answers the question before the model's ask
            question = f"{sentence(said[start].text)} {question}"
        earlier = tuple(m.text for m in reversed(said[:start]) if m.text)
        read = spelling.text(question) if spelling is not None else question
        return cls(read, earlier, last_ask, question)

    def ids_from_subject(self, profiles: Sequence[_ToolProfile]) -> str:
        """The latest earlier message that names an id: what "it" is about."""
        for text in self.earlier:
            if any(p.find_ids(text) for p in profiles if p.ids):
                return text
        return ""

    def ids_for(self, profile: _ToolProfile) -> dict[str, str] | None:
        """A tool's ids from the latest earlier messages that name them."""
        found: dict[str, str] = {}
        for param in profile.ids:
            pattern = param.pattern
            value = next((v for t in self.earlier if pattern and (v := find_id(pattern, t))), None)
            if value is None:
                return None
            found[param.name] = value
        return found


def _own_ask(
    message: Message | None, profiles: Sequence[_ToolProfile]
) -> tuple[_ToolProfile, Param] | None:
    if isinstance(message, AssistantMessage) and not message.calls:
        return _asked_for(message.text, profiles)
    return None


def sentence(text: str) -> str:
    """`text` ending as a sentence does."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


# --- plan -------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What plan decided: calls to make, or words to say."""

    calls: list[Choice] = field(default_factory=list)
    text: str = ""
    declined: bool = False
    """The question is not about what the tools cover: the agent's decline text."""


def _decide(
    talk: _Dialogue,
    profiles: list[_ToolProfile],
    instructions: str = "",
    list_finds: bool = False,
) -> _Plan:
    """Small talk; the answer to the model's own question; ids in the question; a
    number that is not an id; the things an earlier answer listed ("which of those");
    ids of what the conversation was about ("it"); the customer's list, when it finds
    what they speak of (`Phrasebook.list_finds`); else the tool most about it."""
    question = talk.question
    if is_small_talk(question):
        return _Plan(text=_small_talk(question, profiles))
    if (reply := _complete_asked_request(talk, profiles)) is not None:
        return reply
    if (language := other_language(question)) is not None:
        return _in_other_language(language, question, profiles)
    if (action := _action_no_tool_does(question, profiles)) is not None:
        can = "; ".join(_capability(p.spec) for p in profiles)
        handoff = sentence(h) + " " if (h := handoff_text(instructions)) else ""
        return _Plan(
            text=f"Sorry, I can't {action} that for you here. {handoff}I can help with: {can}."
        )
    words = content_words(question)
    allowed = [p for p in profiles if p.allowed(asks_to_change(question), words)]
    chosen = _pick_id_tools(allowed, question, words)
    if not chosen and (missed := near_miss(question, profiles)) is not None:
        return _not_an_id(missed, allowed)
    if not chosen and (listing := _those(talk, allowed)) is not None:
        return _Plan(calls=[(listing, {})])
    if not chosen and _MANY.search(_normalize(question)) and talk.earlier:
        chosen = _pick_id_tools(allowed, talk.earlier[0], words)
    if not chosen and refers_back(question, _nouns(profiles)):
        chosen = _pick_for_subject(allowed, talk.ids_from_subject(profiles), words)
    if chosen:
        return _with_free_text(_add_lookup_for_rest(chosen, allowed, words), talk.said, words)
    if list_finds and _about_theirs(question):
        listing = next((p for p in allowed if _lists(p, _nouns(allowed))), None)
        if listing is not None:
            return _Plan(calls=[(listing, {})])
    return _topical(allowed, talk, words)


_MINE = re.compile(r"\b(?:my|mine|our)\b")


def _about_theirs(text: str) -> bool:
    """Whether a message is about something of the customer's ("my package never
    came", "it was due on the 21st"), not about how things are ("your policy on late
    parcels", "is it free?")."""
    t = _DUMMY_IT.sub(" ", _normalize(text))
    return bool(_MINE.search(t) or _IT.search(t))


_MANY = re.compile(r"\b(?:those|these|them|any of|which one|which of|each of|all of|one of)\b")
"""A message about the things an earlier answer named ("which one of those is late?")."""


def _lists(p: _ToolProfile, nouns: Iterable[str]) -> bool:
    """A read with no arguments that lists the customer's things an id names
    (list_orders: "Your orders")."""
    return not p.params and not p.request_only and any(_stem(n) in p.vocabulary for n in nouns)


def _those(talk: _Dialogue, profiles: list[_ToolProfile]) -> _ToolProfile | None:
    """For a question about the things the latest answer named ("which one of those is
    late?"), the tool that lists them again; None: they are looked up one by one."""
    if not talk.earlier or not _MANY.search(_normalize(talk.question)):
        return None
    named = talk.earlier[0]
    for p in profiles:
        for param in p.ids:
            if param.pattern is not None and len(find_all_ids(param.pattern, named)) >= 2:
                return next((t for t in profiles if _lists(t, [id_noun(param)])), None)
    return None


@dataclass(frozen=True)
class NearMiss:
    """A number the customer gave as an id that no id of the tools can be ("order
    12345": an order ID has 6 digits)."""

    value: str
    param: Param

    def said(self) -> str:
        what = self.param.description.strip().rstrip(".")
        article = "an" if what[:1].lower() in "aeiou" else "a"
        return f"{self.value} is not {article} {_lowered(what)}."


_EXAMPLE = re.compile(r"\blike\s+([A-Za-z]*)(\d+)\b")
_ID_LIKE = re.compile(r"(?<![\w$.,-])#?([A-Za-z]*)(\d{2,})(?![\w-]|[.,]\d)")
_NUMBER = re.compile(r"(?<![\w$])#?(\d{1,4}(?:[-., ]\d{1,4})+|\d{2,})(?![\w-]|[.,]\d)")
"""A number as a customer writes one, digits in groups or not ("12345678", "12-345-678",
"12 345 678", "12.345.678"); a list ("123456, 234567") is two."""


def near_miss(text: str, profiles: Iterable[_ToolProfile]) -> NearMiss | None:
    """The first id-like value in `text` that an id parameter's pattern refuses, though
    it looks like the parameter's example (`order ID (6 digits, like 123456)`): its
    letters, and a few digits more or less. A bare number counts only when it follows
    the id's noun ("order 12345", "order #1234567", "order no. 12-345-678", "my order
    number is 12345678"), so an amount or a year never does."""
    for p in profiles:
        for param in p.ids:
            example = _EXAMPLE.search(param.description)
            if param.pattern is None or example is None:
                continue
            prefix, digits = example.group(1).lower(), len(example.group(2))
            found = (
                _prefixed(text, param.pattern, prefix, digits)
                if prefix
                else _after_noun(text, param.pattern, id_noun(param), digits)
            )
            if found is not None:
                return NearMiss(found, param)
    return None


def _prefixed(text: str, pattern: re.Pattern[str], prefix: str, digits: int) -> str | None:
    """An id of letters and digits ("rtn01" for "like rtn001") the pattern refuses."""
    for m in _ID_LIKE.finditer(text):
        value = m.group(0).lstrip("#")
        if m.group(1).lower() != prefix or abs(len(m.group(2)) - digits) > 2:
            continue
        if find_id(pattern, value) is None:
            return value
    return None


def _after_noun(text: str, pattern: re.Pattern[str], noun: str, digits: int) -> str | None:
    """A number right after the id's noun that the pattern refuses, however its digits
    are grouped ("order 12345678", "order-12-345-678", "order n° 12 345")."""
    before = re.compile(
        rf"\b{re.escape(noun)}s?\W*(?:(?:id|number|no|num|nr)\b\W*|n[°º]\W*)?"
        r"(?:(?:is|was)\b\W*)?$",
        re.IGNORECASE,
    )
    for m in _NUMBER.finditer(text):
        value = m.group(1)
        if abs(sum(c.isdigit() for c in value) - digits) > 2:
            continue
        if find_id(pattern, value) is None and before.search(text[: m.start()]):
            return value
    return None


def _not_an_id(missed: NearMiss, profiles: list[_ToolProfile]) -> _Plan:
    """Say the number is not an id, and show the customer's own, when a tool lists them;
    else ask for the id."""
    listing = next((p for p in profiles if _lists(p, [id_noun(missed.param)])), None)
    if listing is not None:
        return _Plan(calls=[(listing, {})])
    return _Plan(text=f"{missed.said()} {ASK} the {missed.param.description.strip()}.")


_CAN_I_DO = re.compile(r"^(?:can|could|may)\s+(?:i|you|we)\s+(?:please\s+)?([a-z]+)\b")
_ANY_REQUEST = frozenset(
    map(
        _stem,
        ["check", "confirm", "explain", "find", "give", "help", "look", "show", "send", "use"]
        + ["verify"],
    )
)
"""Verbs that ask for help of any kind, not for one thing a tool must do."""


def _action_no_tool_does(question: str, profiles: list[_ToolProfile]) -> str | None:
    """The verb of "can I / can you <verb> ..." when no tool speaks of doing it
    ("Can I change the delivery address ...?"): the question asks for something
    the agent cannot do, whatever else it mentions."""
    m = _CAN_I_DO.match(_normalize(question).strip())
    if m is None:
        return None
    verb = m.group(1)
    stem = _stem(verb)
    if verb in STOPWORDS or stem in _ANY_REQUEST or any(p.matches(stem) for p in profiles):
        return None
    return verb


def _nouns(profiles: Iterable[_ToolProfile]) -> set[str]:
    return {id_noun(param) for p in profiles for param in p.ids}


def _explains(words: Sequence[str], covers: Callable[[str], float]) -> bool:
    """Whether the tools explain the question: most of its words, or the word it
    leads with and a good part of the rest. Otherwise it is about something else
    ("the impact of return rtn001 on world peace")."""
    share = sum(bool(covers(w)) for w in words) / len(words)
    return share >= MIN_COVERAGE or (bool(covers(words[0])) and share >= MIN_LEAD_COVERAGE)


def _key(p: _ToolProfile, words: Sequence[str], verb: str = "") -> tuple[float, bool, bool]:
    """Rank by words covered; on a tie, a tool whose action the request leads with
    ("*create* an entity named Alice"), then a tool that only reads beats one that does
    something (a write needs a clear request)."""
    return p.score(words), bool(verb) and verb in p.action_words, not p.request_only


def _pick_id_tools(profiles: list[_ToolProfile], question: str, words: list[str]) -> list[Choice]:
    """Tools whose ids all appear in the question, one per set of ids.

    Tools taking the same ids (order_status and start_return both take an order
    id) compete: the one covering more of the question's words wins (see `_key`).
    Words another id's tool explains don't count ("has order 123456 shipped and
    is return rtn001 processed": "return" belongs to rtn001).
    """
    groups: dict[tuple[str, ...], list[Choice]] = {}
    verb = _stem(lead_verb(question))
    for p in profiles:
        for found in p.each_id(question) if p.ids else ():
            groups.setdefault(tuple(v.lower() for v in found.values()), []).append((p, found))

    def best(ids: tuple[str, ...], counted: list[str]) -> Choice:
        return max(groups[ids], key=lambda choice: _key(choice[0], counted, verb))

    chosen = {ids: best(ids, words) for ids in groups}
    for ids in groups:
        others = frozenset().union(*(p.vocabulary for i, (p, _) in chosen.items() if i != ids))
        chosen[ids] = best(ids, [w for w in words if w not in others] or words)
    return list(chosen.values())


def _pick_for_subject(profiles: list[_ToolProfile], subject: str, words: list[str]) -> list[Choice]:
    """The one tool that best answers a question about what the conversation was
    last about ("when will it arrive?" after an answer about order 123456)."""
    candidates = [(p, ids) for p in profiles if p.ids and (ids := p.find_ids(subject))]
    if not candidates:
        return []
    return [max(candidates, key=lambda choice: _key(choice[0], words))]


def _add_lookup_for_rest(
    chosen: list[Choice], profiles: list[_ToolProfile], words: list[str]
) -> list[Choice]:
    """Words the id lookups leave unexplained go to a tool without ids, in the same
    reply: "Can I return order 123456?" also searches the return policy."""
    rest = [w for w in words if not any(p.matches(w) for p, _ in chosen)]
    no_ids = [p for p in profiles if not p.ids and not p.request_only]
    if not rest or not no_ids:
        return chosen
    best = max(no_ids, key=lambda p: p.score(rest))
    return chosen + [(best, {})] if best.coverage(rest) >= MIN_COVERAGE else chosen


def _with_free_text(chosen: list[Choice], question: str, words: list[str]) -> _Plan:
    """The calls with their free-text arguments, or a question for a missing reason;
    a decline when the tools explain too little of the question. A call whose schema
    would refuse what the message gives (a list, a value too long) is not made: the
    others are, or the customer hears politely what it needs."""
    if words and not _explains(words, lambda w: any(p.matches(w) for p, _ in chosen)):
        return _Plan(declined=True)
    calls, cannot = [], ""
    for p, ids in chosen:
        args: dict[str, str] = dict(ids)
        for param in p.params:
            if param.is_id:
                continue
            value = find_value(param, question)
            if value is None and param.kind in ("string", None):
                return _Plan(text=_ask_for_reason(p, param, ids))
            if value is not None:
                args[param.name] = value
        refused = [param for param in p.params if not param.accepts(args.get(param.name, ""))]
        if refused:
            cannot = cannot or cannot_make(p, refused, args)
            continue
        calls.append((p, {param.name: args[param.name] for param in p.params}))
    return _Plan(calls=calls) if calls else _Plan(text=cannot)


def cannot_make(p: _ToolProfile, params: Sequence[Param], given: Mapping[str, str] = {}) -> str:
    """A polite answer for a call the model cannot make valid from the customer's words:
    what the call needs, and how long it may be when the words were too many."""
    needs = []
    for param in params:
        what = _lowered(param.description.strip().rstrip("."))
        low, high = param.limits
        if param.name in given and high is not None and len(given[param.name]) > high:
            what += f" of at most {high} characters"
        needs.append(what)
    return f"Sorry, I can't {p.phrase()} from a message like this: it needs {' and '.join(needs)}."


def _lowered(text: str) -> str:
    """`text` with a lower-case first letter, unless its first word is an acronym."""
    first = text.split(" ", 1)[0]
    return text if first.isupper() and len(first) > 1 else text[:1].lower() + text[1:]


def _topical(profiles: list[_ToolProfile], talk: _Dialogue, words: list[str]) -> _Plan:
    """No ids in play: the tool most about the question. On a tie, one that can
    answer at once, unless the question is about something specific of the
    customer's ("how much did I pay?"), which needs an id."""
    specific = refers_back(talk.question, _nouns(profiles))
    # Last, the tool that knows the words fewer tools know: "How do I cancel my
    # order?" is about cancelling, which only one tool speaks of.
    shared = {w: sum(p.matches(w) > 0 for p in profiles) for w in words}
    ranked = sorted(
        profiles,
        key=lambda p: (
            *_key(p, words, _stem(lead_verb(talk.question))),
            bool(p.ids) == specific,
            sum(1 / shared[w] for w in words if p.matches(w)),
        ),
        reverse=True,
    )
    best = ranked[0] if ranked else None
    if best is None or not words or not _explains(words, best.matches):
        return _Plan(declined=True)
    if not best.ids:
        return _with_free_text([(best, {})], talk.said, words)
    ids = talk.ids_for(best)
    if ids is None:
        offer = f"I can {best.phrase()} for you." if best.request_only else "I can look that up."
        return _Plan(text=f"{offer} {ASK} the {best.ids[0].description}.")
    chosen = _add_lookup_for_rest([(best, ids)], profiles, words)
    return _with_free_text(chosen, talk.said, words)


def _in_other_language(language: str, question: str, profiles: list[_ToolProfile]) -> _Plan:
    """What can be done with a message in a language the model does not read: look up
    the ids it names (with the first tool listed that reads them), or ask for English."""
    calls: list[Choice] = []
    for p in profiles:
        if p.request_only or not p.ids or p.reason is not None:
            continue
        for ids in p.each_id(question):
            if not any(found == ids for _, found in calls):
                calls.append((p, ids))
    if calls:
        return _Plan(calls=calls)
    can = "; ".join(_capability(p.spec) for p in profiles)
    said = ONLY_ENGLISH.format(language=language)
    return _Plan(text=f"{said} Please ask in English: I can help with {can}.")


def _ask_for_reason(p: _ToolProfile, param: Param, ids: dict[str, str]) -> str:
    about = " ".join(f"{id_noun(i)} {ids[i.name]}" for i in p.ids if i.name in ids)
    for_what = f" for {about}" if about else ""
    return f"I can {p.phrase()}{for_what}. {ASK} {param.description.rstrip('.')}."


def _names_an_id(text: str, profiles: Iterable[_ToolProfile]) -> bool:
    return any(p.pattern and find_id(p.pattern, text) for t in profiles for p in t.ids)


def _complete_asked_request(talk: _Dialogue, profiles: list[_ToolProfile]) -> _Plan | None:
    """The customer answers the model's "tell me why the item goes back (for order
    123456)": that completes the request the model offered to make."""
    if talk.last_ask is None or is_question(talk.question) or not talk.earlier:
        return None
    profile, param = talk.last_ask
    if param.is_id or _names_an_id(talk.question, profiles):
        return None  # naming an id is a new request, not the answer
    ids = profile.find_ids(talk.earlier[0])
    reason = find_reason(talk.said, param.tool_words)
    if ids is None or reason is None:
        return None
    return _Plan(calls=[(profile, {**ids, param.name: reason})])


def _small_talk(text: str, profiles: list[_ToolProfile]) -> str:
    """A greeting (or a "you're welcome") that says what the agent can help with."""
    can = "; ".join(_capability(p.spec) for p in profiles)
    words = set(re.findall(r"[a-z]+", _normalize(text)))
    if words & _BYE:
        return "Goodbye! Come back any time."
    if words & _NO or (words & _OK and not words & _THANKS):
        return f"No problem. If there is anything else, I can help with: {can}."
    if words & _THANKS:
        return f"You're welcome! If there is anything else, I can help with: {can}."
    return f"Hello! I can help with: {can}. What can I do for you?"


# --- interpret: reading the results -------------------------------------------------------

_ITEM = re.compile(r"(?:^|\s)\[\d+\]\s+")
_FIELD = re.compile(r"(?:^|(?<=[.!?…])\s+)([A-Z][a-z]*(?: [a-z]+){0,2}): ")

Record = dict[str, str]


def parse_records(text: str) -> list[Record]:
    """`Key: value.` sentences back into records, one per `[n]` item of a list.
    Empty when the text is not made of such sentences."""
    items = [t for t in _ITEM.split(text) if t.strip()] if text.startswith("[1] ") else [text]
    records = []
    for item in items:
        found = list(_FIELD.finditer(item))
        if not found or found[0].start() != 0:
            return []
        record = {}
        for m, nxt in zip(found, [*found[1:], None], strict=True):
            value = item[m.end() : nxt.start() if nxt else len(item)].strip()
            record[m.group(1).lower()] = value[:-1] if value.endswith(".") else value
        records.append(record)
    return records


def record_field(record: Record, words: Vocabulary, *names: str) -> str:
    """The value of the first field whose label says one of `names` (a word or a
    concept: "amount" finds "Total")."""
    for label, value in record.items():
        said = content_words(label)
        if any(n in said or n in words.concepts(said) for n in map(_stem, names)):
            return value
    return ""


@dataclass(frozen=True)
class Asked:
    """What the customer's question wants to know."""

    concepts: frozenset[str]
    words: frozenset[str]
    """The stems of its content words."""
    yes_no: bool
    text: str = ""
    """The question, in lower case."""
    upset: bool = False
    """The customer says they are upset (`is_upset`): the answer says sorry first."""

    @classmethod
    def of(cls, question: str, words: Vocabulary) -> Asked:
        said = content_words(question)
        found = frozenset(words.concepts(said))
        return cls(
            found, frozenset(said), is_yes_no(question), _normalize(question), is_upset(question)
        )


@dataclass(frozen=True)
class Reading:
    """One tool result as the offline model read it, for a phrasebook to put in words."""

    tool: str
    text: str
    """The result as the model got it (sentences a shield marked as orders left out)."""
    records: list[Record]
    """Its `Key: value.` sentences as records (empty: not made of them, or an error)."""
    ok: bool
    call: ToolCall | None
    asked: Asked
    words: Vocabulary
    does: bool = False
    """The tool does something (its examples are all requests): its result is what the
    request did, not a lookup."""
    reason: str = ""
    """The reason the call gave, when the tool takes one."""
    earlier: tuple[str, ...] = ()
    """What was said before the question (customer and model), latest first."""

    def field(self, record: Record, *names: str) -> str:
        return record_field(record, self.words, *names)


class Phrasebook:
    """An agent's own words for the offline model: synonyms of its domain, and how its
    records read as answers. The defaults know no domain: a result's records are
    given in their own words. Subclass it, and give it to the agent's offline model:

        Agent(..., models={"offline": lambda _: OfflineModel(MyPhrasebook())})
    """

    synonyms: Mapping[str, str] = {}
    """Concept -> words that say it ("ship": "dispatch sent ship track"), over ENGLISH."""

    def asked(self, question: str, asked: Asked) -> Asked:
        """What the question asks, with what only this domain reads in it (e.g. that
        "where" asks about shipping). Default: as the words say."""
        return asked

    def answer(self, reading: Reading) -> str | None:
        """One result in words; None: the model's own (the result's text)."""
        return None

    def can_offer(self, tool: str, record: Record, reading: Reading) -> bool:
        """Whether to offer `tool` (a tool that does something, which the question asked
        about) for the record a lookup found. Default: unless the record already has
        what the tool would make."""
        return True

    def list_finds(self, asked: Asked) -> bool:
        """Whether the customer's list of their things (a tool like `list_orders`) finds
        the one a message speaks of without its id ("my package never came": the late
        one). Default: no, the model asks for the id."""
        return False


def _usage(prompt: str, reply: str) -> Usage:
    return Usage(model_calls=1, input_tokens=len(prompt.split()), output_tokens=len(reply.split()))


MAX_PASSAGES = 2
"""The passages of an attached document an answer quotes, at most."""


def from_attachments(asked: UserMessage, request: ModelRequest) -> str:
    """The answer to a question with files: the passages of its documents (text files,
    PDFs' text) that share most of the question's words, each with the file it is from;
    and, for images, that it cannot see them."""
    words = set(content_words(asked.text))
    found: list[tuple[int, int, str, str]] = []
    images = []
    for a in asked.attachments:
        if a.is_image:
            images.append(a.name)
            continue
        text = attachments.text_of(a, request.attached(a))
        for passage in _passages(text):
            score = len(words & set(content_words(passage)))
            if score:
                found.append((-score, len(found), a.name, passage))
    said = []
    # The passages that share the most words with the question, in the files' order.
    best = [f for f in sorted(found)[:MAX_PASSAGES] if f[0] == min(found)[0]]
    by_file: dict[str, list[str]] = {}
    for _, _, name, passage in sorted(best, key=lambda f: f[1]):
        by_file.setdefault(name, []).append(passage)
    if by_file:
        said += [f"From {name}: {' '.join(passages)}" for name, passages in by_file.items()]
    elif len(images) < len(asked.attachments):
        said.append("I found nothing about that in the attached files.")
    if images:
        said.append(
            f"I cannot see images, so I have not read {', '.join(images)}; "
            "I read text and PDF files."
        )
    return " ".join(said)


def _passages(text: str) -> list[str]:
    """A document's sentences, each on one line (a paragraph or a heading ends one too)."""
    paragraphs = re.split(r"\n\s*\n|\n(?=#)", text)
    flat = (" ".join(p.split()) for p in paragraphs)
    return [s for p in flat for s in re.split(r"(?<=[.!?])\s+", p) if s.strip()]


class OfflineModel:
    """Deterministic, offline, keyword-and-pattern model. See the module docstring.
    `phrasebook`: the agent's domain words (default: none, records in their own words)."""

    provider = "offline"
    name = "offline-keyword-v1"
    context_window = 32_000
    """Small, as a local model's: long turns compact their conversation."""

    def __init__(self, phrasebook: Phrasebook | None = None) -> None:
        self._phrasebook = phrasebook or Phrasebook()
        self._words = Vocabulary({**ENGLISH, **self._phrasebook.synonyms})
        self._profiles: dict[str, _ToolProfile] = {}
        self._spellings: dict[tuple[str, ...], Spelling] = {}

    def _profiles_of(self, specs: list[ToolSpec]) -> list[_ToolProfile]:
        profiles = []
        for spec in specs:
            key = spec.model_dump_json()
            if key not in self._profiles:
                self._profiles[key] = _ToolProfile.of(spec, self._words)
            profiles.append(self._profiles[key])
        return profiles

    def _spelling_of(self, specs: list[ToolSpec]) -> Spelling:
        """The words the model knows with these tools: their own, and its English."""
        key = tuple(s.model_dump_json() for s in specs)
        if (found := self._spellings.get(key)) is None:
            tools = " ".join(
                f"{s.name} {s.description} {' '.join(s.examples)} {s.parameters}" for s in specs
            )
            languages = " ".join(_OTHER_LANGUAGES.values())
            synonyms = " ".join([*ENGLISH.values(), *self._phrasebook.synonyms.values()])
            found = Spelling(
                re.findall(r"[a-z]+", f"{tools} {synonyms} {languages}".lower())
                + [*STOPWORDS, *_INTERROGATIVES, *_SMALL_TALK, *FEELINGS, *_READ_VERBS]
            )
            self._spellings = {**self._spellings, key: found}
        return found

    def _dialogue(self, request: ModelRequest, profiles: list[_ToolProfile]) -> _Dialogue:
        return _Dialogue.of(request.messages, profiles, self._spelling_of(request.tools))

    async def summarise(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        """The summary compaction asks for: a digest of the calls and their results."""
        return Reply(text=digest(request.question, 4_000))

    # The offline model computes, it waits on nothing: its work runs in a thread, so that
    # a worker with a hundred calls at once still gets each call's heartbeat out (on the
    # event loop, their work in turn starved the heartbeats past their timeout).
    async def plan(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await _written(await asyncio.to_thread(self._plan, request), stream)

    async def interpret(self, request: ModelRequest, stream: TextSink | None = None) -> Reply:
        return await _written(await asyncio.to_thread(self._interpret, request), stream)

    def _plan(self, request: ModelRequest) -> Reply:
        last = request.messages[-1] if request.messages else None
        if isinstance(last, UserMessage) and last.attachments:
            text = from_attachments(last, request)
            return Reply(text=text, usage=_usage(last.text, text))
        if fact := _to_remember(request):
            made = [
                ToolCall(
                    id=f"call_{calls_so_far(request.messages) + 1}",
                    name=REMEMBER_TOOL,
                    arguments={"fact": fact},
                )
            ]
            return Reply(calls=made, usage=_usage(request.question, made[0].render()))
        profiles = self._profiles_of(_tools_to_pick(request))
        talk = self._dialogue(request, profiles)
        refused = [r for r in latest_results(request.messages) if _refused(r)]
        if refused:
            # Asked again because its calls were refused: the same words would make the
            # same calls, so it says what they need instead.
            by_name = {p.spec.name: p for p in profiles}
            decided = _Plan(text=" ".join(dict.fromkeys(_sorry(r, by_name) for r in refused)))
        else:
            asked = self._phrasebook.asked(talk.question, Asked.of(talk.question, self._words))
            finds = self._phrasebook.list_finds(asked)
            decided = _decide(talk, profiles, request.instructions, finds)
        prompt = talk.question + " " + " ".join(s.description for s in request.tools)
        if not decided.calls and decided.declined:
            # No tool of its own covers it: the agent's knowledge may (`Knowledge`).
            known = _from_knowledge(talk.question, latest_results(request.messages))
            if known:
                return Reply(text=known, usage=_usage(prompt, known))
            if any(t.name == SEARCH_TOOL for t in request.tools) and not any(
                c.name == SEARCH_TOOL
                for m in request.messages
                if isinstance(m, AssistantMessage)
                for c in m.calls
            ):
                query = {"query": talk.question[:500]}
                made = [
                    ToolCall(
                        id=f"call_{calls_so_far(request.messages) + 1}",
                        name=SEARCH_TOOL,
                        arguments=query,
                    )
                ]
                return Reply(calls=made, usage=_usage(prompt, made[0].render()))
        if not decided.calls:
            # Declined in the words the instructions give ("reply exactly: ..."), as a
            # chat model reads them there.
            text = decline_text(request.instructions) if decided.declined else decided.text
            return Reply(text=text, usage=_usage(prompt, text))
        first_id = calls_so_far(request.messages) + 1
        made = [
            ToolCall(id=f"call_{first_id + i}", name=p.spec.name, arguments=args)
            for i, (p, args) in enumerate(decided.calls)
        ]
        return Reply(calls=made, usage=_usage(prompt, " ".join(c.render() for c in made)))

    def _interpret(self, request: ModelRequest) -> Reply:
        if request.final_tool:
            return self._typed(request)
        profiles = self._profiles_of(request.tools)
        talk = self._dialogue(request, profiles)
        results = latest_results(request.messages)
        calls = {
            c.id: c for m in request.messages if isinstance(m, AssistantMessage) for c in m.calls
        }
        by_name = {p.spec.name: p for p in profiles}
        asked = self._phrasebook.asked(talk.question, Asked.of(talk.question, self._words))
        readings = [
            self._read(r, calls.get(r.call_id), by_name.get(r.tool), asked, talk) for r in results
        ]
        parts = [
            _sorry(result, by_name)
            if _refused(result)
            else _from_knowledge(talk.question, [result])
            if result.tool in PASSAGE_TOOLS
            else self._phrasebook.answer(r) or r.text
            for result, r in zip(results, readings, strict=True)
        ]
        if language := other_language(talk.question):
            parts.insert(0, ONLY_ENGLISH.format(language=language) + " Here is what I found:")
        elif not _names_an_id(talk.question, profiles) and (
            missed := near_miss(talk.question, profiles)
        ):
            parts.insert(0, missed.said())
        answer = " ".join(p for p in parts if p) or decline_text(request.instructions)
        if offer := self._offer(readings, profiles, talk):
            answer += " " + offer
        prompt = talk.question + " " + " ".join(r.text for r in results)
        return Reply(text=answer, usage=_usage(prompt, answer))

    def _typed(self, request: ModelRequest) -> Reply:
        """A typed turn's value: the output tool's parameters filled by name from the
        records of the latest tool results (`fill`)."""
        spec = next(t for t in request.tools if t.name == request.final_tool)
        records = [
            parse_records(m.text)
            for m in reversed(request.messages)
            if isinstance(m, ToolResult) and m.ok and m.tool != request.final_tool
        ]
        value = fill(spec.parameters, [r for rs in records for r in rs], self._words)
        call = ToolCall(
            id=f"call_{calls_so_far(request.messages) + 1}", name=spec.name, arguments=value
        )
        prompt = " ".join(m.text for m in request.messages if not isinstance(m, AssistantMessage))
        return Reply(calls=[call], usage=_usage(prompt, call.render()))

    def _read(
        self,
        result: ToolResult,
        call: ToolCall | None,
        profile: _ToolProfile | None,
        asked: Asked,
        talk: _Dialogue,
    ) -> Reading:
        """One result as read: errors as the tool said them, records parsed. A result a
        shield marked as data is read for its facts: no sentence of it that reads as
        instructions is passed on to the customer."""
        text = result.text
        if text.startswith(DATA_MARK):
            text = _without_instructions(text.removeprefix(DATA_MARK).lstrip())
        reason = profile.reason if profile else None
        said = str(call.arguments.get(reason.name, "")) if call and reason else ""
        return Reading(
            tool=result.tool,
            text=text,
            records=parse_records(text) if result.ok else [],
            ok=result.ok,
            call=call,
            asked=asked,
            words=self._words,
            does=bool(profile and profile.request_only),
            reason=said,
            earlier=talk.earlier,
        )

    def _offer(self, readings: list[Reading], profiles: list[_ToolProfile], talk: _Dialogue) -> str:
        """After a question about doing something (returning an order) that was
        answered by looking things up, offer to do it: the customer only has to
        give what the request still needs."""
        if any(r.does for r in readings) or not (is_question(talk.question) or readings):
            return ""
        # What the question asks, as the agent's phrasebook reads it too ("it came
        # broken" asks what returning it does).
        words = {*content_words(talk.question), *(w for r in readings for w in r.asked.words)}
        looked_up = {w for r in readings for w in content_words(r.tool.replace("_", " "))}
        for p in profiles:
            reason = p.reason
            action = p.action_words & words
            if not p.request_only or reason is None or not action or action & looked_up:
                continue
            for r in readings:
                args = " ".join(str(v) for v in r.call.arguments.values()) if r.call else ""
                ids = p.find_ids(args) if args else None
                if not (ids and r.records):
                    continue
                # Not already what the request would make, and possible, says the domain.
                made = any(r.field(r.records[0], a) for a in action)
                if not made and self._phrasebook.can_offer(p.spec.name, r.records[0], r):
                    about = " ".join(f"{id_noun(i)} {ids[i.name]}" for i in p.ids)
                    return (
                        f"If you'd like to go ahead, tell me {reason.description} and I'll "
                        f"{p.phrase()} for {about}."
                    )
        return ""


def _tools_to_pick(request: ModelRequest) -> list[ToolSpec]:
    """The tools a plan picks from: never the output tool (it ends a typed turn)."""
    return [t for t in request.tools if t.name != request.final_tool]


def fill(schema: dict[str, Any], records: Sequence[Record], words: Vocabulary) -> dict[str, Any]:
    """An object of `schema` with each property whose name (or a word of it) labels a
    field of a record, newest record first; a list property of objects gets one per
    record. Values are converted to the property's type; what no record has is left out."""
    defs = schema.get("$defs", {})
    out: dict[str, Any] = {}
    for name, prop in _resolved(schema, defs).get("properties", {}).items():
        prop = _resolved(prop, defs)
        if prop.get("type") == "array":
            item = _resolved(prop.get("items", {}), defs)
            if item.get("type") == "object" and records:
                out[name] = [fill({**item, "$defs": defs}, [r], words) for r in records]
            continue
        for record in records:
            found = record.get(name.replace("_", " ").lower()) or record_field(
                record, words, *name.split("_")
            )
            if found:
                out[name] = _as_type(found, prop)
                break
    return out


def _resolved(schema: dict[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """A `$ref` (to `$defs`) as what it names; a nullable `anyOf` as its other type."""
    if "$ref" in schema:
        return _resolved(dict(defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})), defs)
    options = [o for o in schema.get("anyOf", []) if o.get("type") != "null"]
    return _resolved(options[0], defs) if len(options) == 1 else schema


def _as_type(text: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    number = re.search(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    if kind == "integer" and number and "." not in number.group():
        return int(number.group())
    if kind == "number" and number:
        return float(number.group())
    if kind == "boolean":
        return text.strip().lower() in ("yes", "true", "1")
    return text


def _refused(result: ToolResult) -> bool:
    return not result.ok and is_refused_call(result.text)


def _sorry(result: ToolResult, by_name: Mapping[str, _ToolProfile]) -> str:
    """A refused call in words for the customer, never the schema's own."""
    p = by_name.get(result.tool)
    if p is None:
        return "Sorry, I can't do that here."
    return cannot_make(p, p.params) if p.params else f"Sorry, I couldn't {p.phrase()} just now."


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _without_instructions(text: str) -> str:
    """`text` without the sentences that read as orders to the assistant."""
    kept = [s for s in _SENTENCE_END.split(text) if not reads_as_instructions(s)]
    return " ".join(kept)


REMEMBER_TOOL = "remember"
"""Memory's write (`durable_agent.memory`): the fact, in the customer's own words."""
PASSAGE_TOOLS = (SEARCH_TOOL, "recall")
"""The tools whose results are passages (`context_sources.render_passages`): knowledge's
search, and memory's recall (the retrieval step's, for an agent with memory only)."""
_REMEMBER = re.compile(
    r"^\s*(?:please\s+)?(?:remember|keep in mind|note down)(?:\s+that)?\s*[:,]?\s+(.+?)[.!]?\s*$",
    re.IGNORECASE | re.DOTALL,
)


async def _written(reply: Reply, stream: TextSink | None) -> Reply:
    """A reply of text is written out to the stream as a model writes it; calls are not."""
    if reply.text and not reply.calls:
        await write_out(reply.text, stream)
    return reply


def _to_remember(request: ModelRequest) -> str:
    """The fact to keep when the customer asks for it to be remembered ("Please
    remember that I prefer email") and the agent has memory: their own words, so that
    the provenance rules let it run unasked; empty otherwise, or once it is kept."""
    offered = any(
        t.name == REMEMBER_TOOL and "fact" in t.parameters.get("properties", {})
        for t in request.tools
    )
    asked = _REMEMBER.match(request.question) if offered else None
    if asked is None:
        return ""
    since = next(
        (
            i
            for i in range(len(request.messages) - 1, -1, -1)
            if isinstance(request.messages[i], UserMessage)
        ),
        0,
    )
    kept = any(
        c.name == REMEMBER_TOOL
        for m in request.messages[since:]
        if isinstance(m, AssistantMessage)
        for c in m.calls
    )
    return "" if kept else asked.group(1).strip()


def _from_knowledge(question: str, results: Sequence[ToolResult]) -> str:
    """The best passage of the agent's knowledge among these results that shares a word
    of substance with the question, cited by its id; empty if none does. A passage
    marked as data is read without its instruction-like sentences."""
    asked = set(content_words(question))
    for result in results:
        if result.tool not in PASSAGE_TOOLS or not result.ok:
            continue
        text = result.text
        if text.startswith(DATA_MARK):
            text = text.removeprefix(DATA_MARK).lstrip()
        for passage in passages_in(text):
            if asked & set(content_words(passage.text)):
                said = _without_instructions(passage.text)
                if said and passage.id.startswith("mem_"):  # memory's: the customer's words
                    said = f"You told me earlier: {said}"
                return f"{said} [{passage.id}]" if said else ""
    return ""
