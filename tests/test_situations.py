"""What customers really ask, in their own words: problems with an order (damaged,
wrong, late, missing), several orders at once, money back, what no tool can do,
other languages, typos, and listing what is theirs. Through the offline model with
the real shop tools and store, as `test_questions.py` runs its table (the store's
today is the sample data's, 2026-11-24: order 123456, due on the 21st, is late).

Each row: the calls the plan must make, the facts the answer must state, and what
it must not say.
"""

from __future__ import annotations

from pathlib import Path

from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput
from tests.conftest import Harness
from tests.test_questions import Case, problems, run_case

O123, O234, O345 = (f"order_status(order_id='{n}')" for n in ("123456", "234567", "345678"))
O456, O678 = (f"order_status(order_id='{n}')" for n in ("456789", "678901"))
LATE_TAIL = "shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late."
LATE_123 = f"Order 123456 {LATE_TAIL}"
OFFER_123 = "tell me why the item goes back and I'll start a return for order 123456"
DAMAGED_POLICY = "you can return it within 30 days of delivery for a full refund, shipping included"
HANDOFF = "A person on our support team can do that: email support@shop.example"
CANCEL_POLICY = "email support@shop.example with your order ID"
ENGLISH_ONLY = "I'm sorry, I can only read English so far (your message looks like {})."
SORRY = "I'm sorry about that."
NOT_SHIPPED_456 = "has not shipped yet (status: processing); it should arrive by 2026-11-27"
RTN001 = "rtn001 (processed: Refund of $26.85 issued to your card on 2026-10-30)"
RTN002 = "rtn002 (pending: Waiting for the item to arrive at our warehouse)"
RTN003 = (
    "rtn003 (received: Item received on 2026-11-19; the return will be processed by 2026-11-26)"
)
LIST = [
    "You have 5 orders: 456789: 1 × Electric Toothbrush ($49.00), not shipped yet",
    "123456: 2 × Herbal Handsoap ($19.98), shipped on 2026-11-18, 3 days late",
    "678901: 2 × Sandalwood Soap Bar ($15.90), delivered",
    "345678: 3 × Lavender Bath Salts ($26.85), delivered",
]


def also_policy(question: str, *calls: str) -> list[str]:
    return [*calls, f"search_policies(query={question!r})"]


def q(question: str, calls: list[str], facts: list[str], *absent: str, before: str = "") -> Case:
    return Case(question, calls, facts, before=(before,) if before else (), absent=absent)


DAMAGED = "My order 678901 arrived damaged, the soap bar was crushed. What can I do?"
BROKEN = "The soap in order 123456 arrived broken, what now?"
CRACK = "order 123456 came with a crack in the bottle, what are my options?"
WRONG = "I got the wrong item in order 123456"
WRONG_LONG = "The wrong item came in order 123456, I ordered soap and got a toothbrush"
DEFECT = "The toothbrush set from order 234567 is defective, can I get a replacement?"
SPILLED = "The bath salts from 345678 arrived spilled, what can I do?"
LEAK = "Item in order 678901 is leaking, help"
SMASHED = "Received order 123456 but the bottle was smashed."
NEVER_GOT = "Order 234567 says delivered but I never got it"
MONEY = "I want my money back for order 345678"
REFUND_123 = "Can I get a refund for order 123456?"
MONEY_234 = "When do I get my money back for order 234567?"
REFUND_678 = "Where is my refund for order 678901?"
REFUNDED_345 = "Have I been refunded for 345678?"
REFUND_456 = "Refund order 456789 please"
CANCEL_456 = "Please cancel order 456789"
CANCEL_123 = "Cancel my order 123456"
CANCEL_ASAP = "I need to cancel 456789 asap"

CASES = [
    # Damaged, broken or wrong: the open return, or what can be done and the offer.
    q(
        DAMAGED,
        also_policy(DAMAGED, O678),
        [SORRY, f"already has a return: {RTN002}", DAMAGED_POLICY],
        OFFER_123,
    ),
    q(BROKEN, also_policy(BROKEN, O123), [SORRY, DAMAGED_POLICY, OFFER_123], "days late"),
    q(CRACK, also_policy(CRACK, O123), [SORRY, DAMAGED_POLICY, OFFER_123]),
    q(WRONG, also_policy(WRONG, O123), [SORRY, "is not what you ordered", OFFER_123]),
    q(
        WRONG_LONG,
        also_policy(WRONG_LONG, O123),
        [SORRY, "Order 123456 is for 2 × Herbal Handsoap", OFFER_123],
    ),
    q(DEFECT, also_policy(DEFECT, O234), ["1 × Bamboo Toothbrush Set", "replace it"]),
    q(
        SPILLED,
        also_policy(SPILLED, O345),
        [SORRY, f"already has a return: {RTN001}"],
        "I'll start a return",
    ),
    q(
        LEAK,
        also_policy(LEAK, O678),
        [SORRY, f"already has a return: {RTN002}"],
        "I'll start a return",
    ),
    q(SMASHED, also_policy(SMASHED, O123), [SORRY, OFFER_123], "days late"),
    # Several ids: every one answered.
    q(
        "Status of my orders 123456 and 234567?",
        [O123, O234],
        [
            "Order 123456 is for 2 × Herbal Handsoap",
            "Order 234567 is for 1 × Bamboo Toothbrush Set",
            "It has been delivered (shipped on 2026-11-02",
        ],
    ),
    q(
        "Have 123456 and 456789 shipped yet?",
        [O123, O456],
        ["Yes — order 123456 shipped on 2026-11-18", f"No — order 456789 {NOT_SHIPPED_456}"],
    ),
    q(
        "What did I pay for orders 123456 and 345678?",
        [O123, O345],
        ["The total for order 123456 was $19.98", "The total for order 345678 was $26.85"],
    ),
    q(
        "Where are orders 123456, 234567 and 678901?",
        [O123, O234, O678],
        [LATE_123, "Order 234567 has been delivered", "Order 678901 has been delivered"],
    ),
    q(
        "Check returns rtn001 and rtn003 please",
        ["return_status(return_id='rtn001')", "return_status(return_id='rtn003')"],
        ["Return rtn001 for order 345678 has been processed", "Return rtn003 for order 234567"],
    ),
    q(
        "When do 456789 and 123456 arrive?",
        [O456, O123],
        [f"Order 456789 {NOT_SHIPPED_456}", LATE_123],
    ),
    q(
        "What's in orders 234567 & 678901?",
        [O234, O678],
        ["1 × Bamboo Toothbrush Set", "2 × Sandalwood Soap Bar"],
    ),
    q(
        "Has order 123456 shipped and what about 678901?",
        [O123, O678],
        ["Yes — order 123456 shipped", "order 678901 has been delivered"],
    ),
    # Late or missing: recognised against today's date.
    q(
        "I haven't received my package yet, order 123456 was supposed to arrive on the 21st. "
        "Where is it?",
        [O123],
        [SORRY, LATE_123, "tracking link of order 123456"],
    ),
    q("My parcel for order 123456 never arrived", [O123], [SORRY, LATE_123]),
    q("Order 123456 is late, where is it?", [O123], [LATE_123]),
    q("Still waiting for 123456, it's overdue", [O123], [LATE_123]),
    q("Is my order 123456 delayed?", [O123], ["Yes — order 123456 shipped", "it is 3 days late"]),
    q("Why hasn't order 456789 shipped yet?", [O456], [f"Order 456789 {NOT_SHIPPED_456}"], "late"),
    q("Will order 456789 arrive before the 30th?", [O456], ["it should arrive by 2026-11-27"]),
    q(
        NEVER_GOT,
        also_policy(NEVER_GOT, O234),
        [SORRY, "Order 234567 has been delivered", "check with neighbours"],
    ),
    q("I never got order 234567", [O234], [SORRY, "Order 234567 has been delivered"]),
    # Money back: the order's refund, or how to get one.
    q(MONEY, also_policy(MONEY, O345), [f"Order 345678 already has a return: {RTN001}"]),
    q(REFUND_123, also_policy(REFUND_123, O123), ["Refunds policy says", OFFER_123]),
    q(
        MONEY_234,
        also_policy(MONEY_234, O234),
        [f"already has a return: {RTN003}"],
        "I'll start a return",
    ),
    q(REFUND_678, also_policy(REFUND_678, O678), [f"already has a return: {RTN002}"]),
    q(REFUNDED_345, also_policy(REFUNDED_345, O345), [RTN001]),
    q(
        REFUND_456,
        also_policy(REFUND_456, O456),
        [f"Order 456789 {NOT_SHIPPED_456}"],
        "I'll start a return",
    ),
    q(
        "I'd like a refund on return rtn003",
        ["return_status(return_id='rtn003')"],
        ["Return rtn003 for order 234567 has been received", "processed by 2026-11-26"],
    ),
    # What no tool does: what the customer can do next, and who can do it.
    q(CANCEL_456, also_policy(CANCEL_456, O456), ["cancel it free of charge", CANCEL_POLICY]),
    q(
        CANCEL_123,
        also_policy(CANCEL_123, O123),
        ["Order 123456 has already shipped, so it can no longer be cancelled"],
    ),
    q(CANCEL_ASAP, also_policy(CANCEL_ASAP, O456), [CANCEL_POLICY]),
    q(
        "Can you change the delivery address on order 456789?",
        [],
        ["Sorry, I can't change that for you here.", HANDOFF],
    ),
    q("Can I change the shipping address for 456789?", [], [HANDOFF]),
    q(
        "Can you upgrade order 456789 to express shipping?",
        [],
        ["Sorry, I can't upgrade that for you here.", HANDOFF],
    ),
    # Other languages: said in English, with what the ids allow.
    q("¿Dónde está mi pedido 123456?", [O123], [ENGLISH_ONLY.format("Spanish"), LATE_TAIL]),
    q("Wo ist meine Bestellung 123456?", [O123], [ENGLISH_ONLY.format("German"), "3 days late"]),
    q("Où est ma commande 123456 ?", [O123], [ENGLISH_ONLY.format("French"), "Herbal Handsoap"]),
    q(
        "Hola, quiero devolver mi pedido",
        [],
        [ENGLISH_ONLY.format("Spanish"), "Please ask in English: I can help with status of"],
    ),
    q(
        "Ich möchte mein Geld zurück für Bestellung 345678",
        [O345],
        [ENGLISH_ONLY.format("German"), "Lavender Bath Salts"],
    ),
    q("Dov'è il mio ordine 456789?", [O456], [ENGLISH_ONLY.format("Italian"), NOT_SHIPPED_456]),
    q("Waar is mijn bestelling 234567?", [O234], [ENGLISH_ONLY.format("Dutch"), "delivered"]),
    q("Bonjour, merci pour votre aide", [], [ENGLISH_ONLY.format("French")]),
    # What is theirs.
    q("What orders do I have?", ["list_orders()"], LIST),
    q("Show me all my orders", ["list_orders()"], LIST),
    q("list my orders pls", ["list_orders()"], LIST),
    q("Which orders have I placed?", ["list_orders()"], LIST),
    # Typos, shorthand, greetings, follow-ups.
    q("has ordr 123456 shiped?", [O123], ["Yes — order 123456 shipped on 2026-11-18"]),
    q("wheres my order 123456", [O123], [LATE_TAIL]),
    q("when wil 456789 arrive", [O456], ["it should arrive by 2026-11-27"]),
    q(
        "whats the status of rtn002",
        ["return_status(return_id='rtn002')"],
        ["Return rtn002 for order 678901 is pending"],
    ),
    q(
        "tracking for 123456 plz",
        ["tracking_link(order_id='123456')"],
        ["https://shop.example/track/123456"],
    ),
    q("how much was order 678901??", [O678], ["The total for order 678901 was $15.90"]),
    q("what did i buy in 234567", [O234], ["Order 234567 is for 1 × Bamboo Toothbrush Set"]),
    q("Hi there, has 345678 been delivered yet?", [O345], ["Order 345678 has been delivered"]),
    q(
        "ok and what about order 678901?",
        [O678],
        ["Order 678901 is for 2 × Sandalwood Soap Bar"],
        before="Has order 123456 shipped?",
    ),
    q("RTN003 status?", ["return_status(return_id='RTN003')"], ["Return rtn003 for order 234567"]),
    q("Is order #123456 on its way?", [O123], [LATE_TAIL]),
    q(
        "And is it late?",
        [O123],
        ["it is 3 days late"],
        before="Which item was ordered for 123456?",
    ),
]


async def test_what_customers_really_ask(tmp_path: Path) -> None:
    failures = []
    for i, case in enumerate(CASES):
        turn = await run_case(case, tmp_path / f"chat{i}.db")
        failures += [(case.question, wrong) for wrong in problems(case, turn)]
    report = "\n".join(f"- {question!r}: {wrong}" for question, wrong in failures)
    assert not failures, f"{len(failures)} problem(s) in {len(CASES)} questions:\n{report}"


def test_the_table_is_new_and_wide() -> None:
    from tests.test_questions import CASES as SEED_TABLE

    assert len(CASES) >= 60
    asked = {(c.before, c.question) for c in CASES}
    assert len(asked) == len(CASES)
    assert not asked & {(c.before, c.question) for c in SEED_TABLE}


async def test_where_to_turn_passes_the_output_shield(harness: Harness) -> None:
    """The address the hand-off gives comes from the agent's own instructions, which
    an answer may draw on: the output shield lets it through in a real turn."""
    async with harness.worker() as task_queue:
        turn = TurnInput(question="Can you change the delivery address on order 456789?")
        result = await (await start_turn(harness.client, turn, task_queue)).result()
    assert result.outcome is Outcome.ANSWERED, result.answer
    assert HANDOFF in result.answer
