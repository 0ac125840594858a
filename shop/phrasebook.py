"""How the demo shop's records read as answers, for the offline model.

A language model knows that an order "shipped" or "should arrive by" a date, that
"where is it?" asks about shipping and "has it been refunded?" about a return's
status; the offline model knows none of it (it reads only what a model is given).
This phrasebook is the shop's share of that knowledge, given to the shop agent's
offline model (`shop.agent`); the model itself stays a word-rule program.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from durable_agent.offline import (
    Asked,
    OfflineModel,
    Phrasebook,
    Reading,
    Record,
    content_words,
    sentence,
)

_NOT_ARRIVED = re.compile(
    r"(?:\bnot\b|n't\b|\bnever\b|\bstill\b|\byet to\b).*\b(?:arriv|receiv|come|came|got|here)"
)
"""A parcel the customer is still waiting for: "I haven't received it", "never came"."""


_WANTS = re.compile(r"\b(?:can|could|may|want|like|get|need)\b")
"""A question that asks for something ("can I get a refund?"), not where it is."""


class ShopPhrasebook(Phrasebook):
    synonyms = {
        "ship": "dispatch sent ship track package parcel",
        "arrive": "arrival arrive come deliver delivery receive",
        "refund": "complete done finish process refund money reimburse",
        "damage": "damage broken break crush defect faulty wrong leak crack smash spill",
        "late": "late delay overdue missing lost never wait",
    }

    def asked(self, question: str, asked: Asked) -> Asked:
        """ "Where is it?" asks about shipping; "when ...?" about arriving, unless it
        asks when something ships or is refunded. An item that came damaged or wrong
        asks what returning it does; a parcel that is late or missing, where it is."""
        found, words = set(asked.concepts), set(asked.words)
        if re.search(r"\bwhere\b", asked.text):
            found.add("ship")
        if re.search(r"\bwhen\b", asked.text) and not found & {"ship", "refund"}:
            found.add("arrive")
        if "damage" in found or ("refund" in found and _WANTS.search(asked.text)):
            words.add("return")  # what returning it does, or that it has a return
        if "late" in found or _NOT_ARRIVED.search(asked.text):
            found |= {"late", "ship"}
        return replace(asked, concepts=frozenset(found), words=frozenset(words))

    def answer(self, reading: Reading) -> str | None:
        if not reading.records:
            return None
        first = reading.records[0]
        if "excerpt" in first:
            return _policy_answer(reading.records, reading.asked)
        if "return id" in first:
            if reading.does:
                return _started_return_answer(reading, first)
            return _return_answer(reading, first)
        if "order id" in first:
            if reading.text.startswith("[1] "):
                return _orders_answer(reading)
            return _order_answer(reading, first)
        return None

    def can_offer(self, tool: str, record: Record, reading: Reading) -> bool:
        """A return can be started for an order that has shipped."""
        return bool(reading.field(record, "shipped"))

    def list_finds(self, asked: Asked) -> bool:
        """The customer's orders find the one that is late ("my package never came") or
        was due on a day they name ("it was due on the 21st")."""
        return "late" in asked.concepts or _day_asked(asked.text) is not None


SORRY = "I'm sorry about that."


def offline_model(_arg: str = "") -> OfflineModel:
    """The offline model with the shop's phrasebook (the shop agent's `offline`)."""
    return OfflineModel(ShopPhrasebook())


_DAY = re.compile(
    r"\b(?:on|by|for|the)\s+(?:the\s+)?(\d{1,2})(?:st|nd|rd|th)?\b(?![-/:.]\d)"
    r"|\b(\d{1,2})(?:st|nd|rd|th)\b|\b\d{4}-\d{2}-(\d{2})\b"
)
"""A day of the month the customer names: "on the 21st", "due 21st", "2026-11-21"."""


def _day_asked(text: str) -> int | None:
    m = _DAY.search(text)
    day = int(next(g for g in m.groups() if g)) if m else 0
    return day if 1 <= day <= 31 else None


def _orders_answer(r: Reading) -> str:
    """The customer's orders, one line each; first the one the question is about, when
    it names it by a day or asks which is late ("which one of those is late?"): then
    only that, when the conversation has just listed them."""
    listed = _orders_list(r)
    found = _orders_found(r)
    if found is None:
        return listed
    ids = [r.field(record, "order") for record in r.records]
    shown = any(all(i in earlier for i in ids) for earlier in r.earlier[:1])
    return found if shown else f"{found} {listed}"


def _orders_found(r: Reading) -> str | None:
    """The orders the question picks out: due on the day it names, or late."""
    day = _day_asked(r.asked.text)
    if day is not None:
        found = [x for x in r.records if _day_of(r.field(x, "expected", "delivery")) == day]
        missing = f"None of your orders was due on the {_ordinal(day)}."
    elif "late" in r.asked.concepts:
        found = [x for x in r.records if _late(r, x)]
        missing = "None of your orders is late."
    else:
        return None
    if not found:
        return missing
    sentences = [_shipping(r, x, f"order {r.field(x, 'order')} ({_what(r, x)})") for x in found]
    late = [r.field(x, "order") for x in found if _late(r, x) and r.field(x, "shipped")]
    sorry = [SORRY] if late or r.asked.upset else []
    track = [f"Ask me for the tracking link of order {i} to see where it is." for i in late]
    return " ".join(_capitalized(t) for t in [*sorry, *sentences, *track])


def _day_of(date: str) -> int | None:
    m = re.fullmatch(r"\d{4}-\d{2}-(\d{2})", date.strip())
    return int(m.group(1)) if m else None


def _ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def _what(r: Reading, record: Record) -> str:
    quantity, item = r.field(record, "quantity"), r.field(record, "item")
    return f"{quantity} × {item}" if quantity else item


def _orders_list(r: Reading) -> str:
    """The customer's orders, one line each."""
    lines = []
    for record in r.records:
        order_id, item = r.field(record, "order"), r.field(record, "item")
        quantity, total = r.field(record, "quantity"), r.field(record, "amount")
        lines.append(
            f"{order_id}: {quantity} × {item} ({total}), {_state(r, record)}"
            + (f", return {returns}" if (returns := r.field(record, "return")) else "")
        )
    count = f"{len(lines)} orders" if len(lines) != 1 else "one order"
    return f"You have {count}: " + "; ".join(lines) + "."


def _state(r: Reading, record: Record) -> str:
    """Where an order is, in a few words."""
    status, shipped_on = r.field(record, "status"), r.field(record, "shipped")
    late = _late(r, record)
    if "arrive" in r.words.concepts(content_words(status)):
        return f"delivered (shipped on {shipped_on})"
    if shipped_on:
        return f"shipped on {shipped_on}" + (f", {late}" if late else "")
    return f"not shipped yet ({status})" + (f", {late}" if late else "")


def _late(r: Reading, record: Record) -> str:
    """ "3 days late", or nothing."""
    days = r.field(record, "late")
    if not days.isdigit() or int(days) <= 0:
        return ""
    return f"{days} day{'s' if int(days) != 1 else ''} late"


def _order_answer(r: Reading, record: Record) -> str:
    asked = r.asked
    order_id = r.field(record, "order")
    item = r.field(record, "item")
    quantity = r.field(record, "quantity")
    what = f"{quantity} × {item}" if quantity else item
    total = r.field(record, "amount")
    sentences = []
    shipped = r.field(record, "shipped")
    if "return" in asked.words or "refund" in asked.concepts:
        # Whether it can go back (or has): a return it has already, or that it has
        # not shipped.
        if returns := r.field(record, "return"):
            sentences.append(f"Order {order_id} already has a return: {returns}.")
        elif not shipped:
            sentences.append(_shipping(r, record, f"order {order_id}"))
        elif "damage" in asked.concepts:
            sentences.append(f"Order {order_id} is for {what} ({total}).")
    if "cancel" in asked.words and shipped:
        sentences.append(
            f"Order {order_id} has already shipped, so it can no longer be cancelled; "
            "you can return it once it arrives."
        )
    if asked.concepts & {"item", "quantity"}:
        sentences.append(f"Order {order_id} is for {what}.")
    if "amount" in asked.concepts:
        sentences.append(f"The total for order {order_id} was {total} ({what}).")
    if asked.concepts & {"ship", "arrive"} and "damage" not in asked.concepts:
        subject = "it" if sentences else f"order {order_id}"
        sentences.append(_shipping(r, record, subject, asked))
    if not sentences:
        sentences = [f"Order {order_id} is for {what} ({total}).", _shipping(r, record, "it")]
    if asked.concepts & {"damage", "late"} or asked.upset:
        sentences.insert(0, SORRY)
    if "late" in asked.concepts and r.field(record, "shipped") and _late(r, record):
        sentences.append(f"Ask me for the tracking link of order {order_id} to see where it is.")
    return " ".join(_capitalized(s) for s in sentences)


def _shipping(r: Reading, record: Record, subject: str, asked: Asked | None = None) -> str:
    """Where the order is, with its dates; yes or no first when that was asked."""
    status = r.field(record, "status")
    shipped_on = r.field(record, "shipped")
    expected = r.field(record, "expected", "delivery")
    delivered = "arrive" in r.words.concepts(content_words(status))
    late = _late(r, record)
    if delivered:
        text = f"{subject} has been delivered (shipped on {shipped_on}, due on {expected})."
    elif shipped_on and late:
        text = f"{subject} shipped on {shipped_on} and was due by {expected}: it is {late}."
    elif shipped_on:
        text = f"{subject} shipped on {shipped_on} and should arrive by {expected}."
    elif late:
        text = (
            f"{subject} has not shipped yet (status: {status}) and was due by {expected}: "
            f"it is {late}."
        )
    else:
        due = f"; it should arrive by {expected}" if expected else ""
        text = f"{subject} has not shipped yet (status: {status}){due}."
    if asked is None or not asked.yes_no:
        return text
    if "ship" in asked.concepts:
        return ("Yes — " if shipped_on or delivered else "No — ") + text
    return ("Yes — " if delivered else "Not yet — ") + text


def _return_answer(r: Reading, record: Record) -> str:
    asked = r.asked
    return_id, order_id = r.field(record, "return"), r.field(record, "order")
    status, detail = r.field(record, "status"), r.field(record, "detail")
    text = f"Return {return_id} for order {order_id} {_is(status)}. {sentence(detail)}"
    status_concepts = r.words.concepts(content_words(status)) | set(content_words(status))
    asked_status = asked.concepts & {"refund"} or asked.words & {"receiv", "pend", "request"}
    if not asked.yes_no or not asked_status:
        return text
    return ("Yes — " if asked_status & status_concepts else "Not yet — ") + _lowered(text)


def _started_return_answer(r: Reading, record: Record) -> str:
    """A return the request started, or the open one the store gave back instead."""
    return_id, order_id = r.field(record, "return"), r.field(record, "order")
    status, detail = r.field(record, "status"), r.field(record, "detail")
    if _is_new_return(return_id, detail, r.reason, r.earlier):
        return f"I've started return {return_id} for order {order_id} (status: {status}). " + (
            sentence(detail)
        )
    return (
        f"Order {order_id} already has an open return, {return_id} (status: {status}), "
        f"so I did not start a new one. {sentence(detail)}"
    )


def _is_new_return(return_id: str, detail: str, reason: str, earlier: Sequence[str]) -> bool:
    """A new return records the reason this request gave; an open one the store
    gives back holds its own (and may have been named in this conversation)."""
    if any(return_id.lower() in t.lower() for t in earlier):
        return False
    said = " ".join(reason.split()).strip(" .").lower().rstrip("…")[:40]
    return bool(said) and said in " ".join(detail.split()).lower()


def _policy_answer(records: list[Record], asked: Asked) -> str:
    """The best document's sentences; the next one's too when its title is about
    something else the question asks."""
    first, *rest = records
    parts = [f"Our {first.get('title', '')} policy says: {sentence(first.get('excerpt', ''))}"]
    seen = set(content_words(first.get("title", "")))
    for other in rest:
        title_words = set(content_words(other.get("title", "")))
        if title_words & asked.words - seen:
            parts.append(f"Our {other.get('title', '')} policy says: {sentence(other['excerpt'])}")
            seen |= title_words
    return " ".join(parts)


def _is(status: str) -> str:
    """A status after its return: has been received, is pending."""
    return f"has been {status}" if status.endswith("ed") else f"is {status}"


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def _lowered(text: str) -> str:
    return text[:1].lower() + text[1:]
