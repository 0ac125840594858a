"""The demo shop's sample questions: what customers ask, the calls an answer needs
and the facts it must state. Two tables: `SEED`, the questions the agent was built
on, and `SITUATIONS`, what customers really ask in their own words (problems with an
order, several orders at once, money back, what no tool does, other languages,
typos, listing what is theirs). The store's today is the sample data's
(2026-11-24), so the facts hold whenever they are checked.

`tests/test_questions.py` and `tests/test_situations.py` check them against the
offline model without a server; `python -m durable_agent.evals questions` runs them as durable
turns of the shop's agent, with any model.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_agent.answers import DECLINE
from durable_agent.shop.store import ORDER_NOT_FOUND, RETURN_NOT_FOUND


@dataclass(frozen=True)
class Case:
    question: str
    calls: list[str]
    """The calls plan makes, as `call.render()` shows them; [] for a direct answer."""
    facts: list[str]
    """Text the answer must contain."""
    before: tuple[str, ...] = ()
    """Earlier questions of the same chat, asked first."""
    absent: tuple[str, ...] = ()
    """Text the answer must not contain."""


def policy(question: str) -> str:
    return f"search_policies(query={question!r})"


ORDER_123456 = "order_status(order_id='123456')"
RETURNS_POLICY = "within 30 days of delivery for a full refund"
OFFER = "tell me why the item goes back and I'll start a return for order 123456"

SEED = [
    # The seed's six questions.
    Case("Which item was ordered for 123456?", [ORDER_123456], ["Order 123456", "Herbal Handsoap"]),
    Case(
        "When is my return rtn003 processed?",
        ["return_status(return_id='rtn003')"],
        ["Return rtn003 for order 234567 has been received", "processed by 2026-11-26"],
    ),
    Case("How is the weather in Scotland right now?", [], [DECLINE]),
    Case(
        "Which item was ordered for 383833?", ["order_status(order_id='383833')"], [ORDER_NOT_FOUND]
    ),
    Case(
        "When is my return rtn123 processed?",
        ["return_status(return_id='rtn123')"],
        [RETURN_NOT_FOUND],
    ),
    Case("What is the impact of return rtn001 on world peace?", [], [DECLINE]),
    # Something no tool does, about an order: no lookup, no "not yet".
    Case(
        "Can I change the delivery address on order 456789?",
        [],
        [
            "Sorry, I can't change that for you here. A person on our support team can do "
            "that: email support@shop.example",
            "I can help with: status of a specific order",
        ],
    ),
    # Shipping: yes or no, with the dates.
    Case(
        "Has order 123456 shipped?",
        [ORDER_123456],
        ["Yes — order 123456 shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late."],
    ),
    Case(
        "Hi, could you tell me if order 123456 has shipped?",
        [ORDER_123456],
        ["Yes — order 123456 shipped on 2026-11-18"],
    ),
    Case(
        "Did order 456789 ship yet?",
        ["order_status(order_id='456789')"],
        ["No — order 456789 has not shipped yet", "arrive by 2026-11-27"],
    ),
    Case("Has order 123456 arrived?", [ORDER_123456], ["Not yet — order 123456", "by 2026-11-21"]),
    Case(
        "Where is my order 234567?",
        ["order_status(order_id='234567')"],
        ["Order 234567 has been delivered", "2026-11-02"],
    ),
    Case(
        "When will order 456789 arrive?",
        ["order_status(order_id='456789')"],
        ["Order 456789 has not shipped yet", "2026-11-27"],
    ),
    # Totals, items, the whole order.
    Case("How much did I pay for order 123456?", [ORDER_123456], ["order 123456 was $19.98"]),
    Case(
        "What was the order total for order 234567?",
        ["order_status(order_id='234567')"],
        ["order 234567 was $12.50"],
    ),
    Case("What did order 678901 cost?", ["order_status(order_id='678901')"], ["$15.90", "678901"]),
    Case(
        "What did I buy in order 678901?",
        ["order_status(order_id='678901')"],
        ["Order 678901 is for 2 × Sandalwood Soap Bar"],
    ),
    Case(
        "How many items are in order 345678?",
        ["order_status(order_id='345678')"],
        ["Order 345678 is for 3 × Lavender Bath Salts"],
    ),
    Case(
        "What's the status of order 678901?",
        ["order_status(order_id='678901')"],
        ["Order 678901", "Sandalwood Soap Bar", "delivered"],
    ),
    Case(
        "Which item was ordered for 567890?", ["order_status(order_id='567890')"], [ORDER_NOT_FOUND]
    ),
    # Returns: status and next step.
    Case(
        "Is my return rtn001 processed?",
        ["return_status(return_id='rtn001')"],
        ["Yes — return rtn001 for order 345678 has been processed", "$26.85"],
    ),
    Case(
        "Has my return rtn003 been refunded?",
        ["return_status(return_id='rtn003')"],
        ["Not yet — return rtn003", "processed by 2026-11-26"],
    ),
    Case(
        "What's the status of my return rtn002?",
        ["return_status(return_id='rtn002')"],
        ["Return rtn002 for order 678901 is pending", "Waiting for the item to arrive"],
    ),
    # Policies: the best document's sentences.
    Case(
        "Do you ship to Canada?",
        [policy("Do you ship to Canada?")],
        ["Shipping and delivery", "internationally to Canada", "$14.95"],
    ),
    Case(
        "How long does a refund take?",
        [policy("How long does a refund take?")],
        ["Card refunds take 3 to 5 business days"],
    ),
    Case("Can I use a gift card?", [policy("Can I use a gift card?")], ["store gift cards"]),
    Case("May I ask where order 123456 is?", [ORDER_123456], ["shipped on 2026-11-18"]),
    # A country the documents do not name: the sentence on where they deliver.
    Case(
        "Do you ship to Germany?",
        [policy("Do you ship to Germany?")],
        ["we cannot deliver to other countries yet"],
    ),
    # The whole policy: the document's opening, not the sentences repeating a word.
    Case(
        "What is your return policy?",
        [policy("What is your return policy?")],
        [RETURNS_POLICY, "only if they are faulty", "To start a return, tell us your order ID"],
    ),
    Case(
        "What is your shipping policy?",
        [policy("What is your shipping policy?")],
        ["Orders ship within 2 business days", "Canada and the United Kingdom", "$35"],
    ),
    Case(
        "How much does express shipping cost?",
        [policy("How much does express shipping cost?")],
        ["express delivery takes 1 to 2 business days and costs $9.95"],
    ),
    Case(
        "Which payment methods do you accept?",
        [policy("Which payment methods do you accept?")],
        ["Visa, Mastercard, American Express, PayPal"],
    ),
    Case(
        "Is there a warranty on electric toothbrushes?",
        [policy("Is there a warranty on electric toothbrushes?")],
        ["one-year warranty"],
    ),
    Case(
        "How do I cancel my order?",
        [policy("How do I cancel my order?")],
        ["cancel it free of charge"],
    ),
    Case(
        "Can I return opened soap?",
        [policy("Can I return opened soap?")],
        ["Opened personal care products (soaps, oils, bath salts) can be returned only if"],
    ),
    # An order and a policy, looked up at once; questions about returning never write.
    Case(
        "Can I return my order 123456 based on store policy?",
        [ORDER_123456, policy("Can I return my order 123456 based on store policy?")],
        ["Order 123456", "shipped on 2026-11-18", RETURNS_POLICY, OFFER],
    ),
    Case(
        "Can I return order 123456?",
        [ORDER_123456, policy("Can I return order 123456?")],
        ["Order 123456", RETURNS_POLICY, OFFER],
    ),
    Case(
        "What happens if I return order 123456?",
        [ORDER_123456, policy("What happens if I return order 123456?")],
        ["Order 123456", RETURNS_POLICY, OFFER],
    ),
    # ... and no offer to start one where the order says it cannot go back.
    Case(
        "Can I return order 234567?",
        ["order_status(order_id='234567')", policy("Can I return order 234567?")],
        [
            "Order 234567 already has a return: rtn003 (received: Item received on 2026-11-19",
            RETURNS_POLICY,
        ],
        absent=("I'll start a return",),
    ),
    Case(
        "Can I return order 345678?",
        ["order_status(order_id='345678')", policy("Can I return order 345678?")],
        [
            "Order 345678 already has a return: rtn001 (processed: Refund of $26.85",
            "cannot be returned again",
        ],
        absent=("I'll start a return",),
    ),
    Case(
        "Can I return order 456789?",
        ["order_status(order_id='456789')", policy("Can I return order 456789?")],
        ["Order 456789 has not shipped yet (status: processing)"],
        absent=("I'll start a return",),
    ),
    Case(
        "Can I cancel order 456789?",
        ["order_status(order_id='456789')", policy("Can I cancel order 456789?")],
        ["Order 456789", "has not shipped yet", "cancel it free of charge"],
    ),
    Case(
        "Is there a warranty on order 456789?",
        ["order_status(order_id='456789')", policy("Is there a warranty on order 456789?")],
        ["Order 456789 is for 1 × Electric Toothbrush", "one-year warranty"],
    ),
    Case(
        "Has order 123456 shipped and is return rtn001 processed?",
        [ORDER_123456, "return_status(return_id='rtn001')"],
        ["Yes — order 123456 shipped", "Yes — return rtn001 for order 345678 has been processed"],
        absent=("start a return",),
    ),
    # Explicit requests to return something.
    Case(
        "I want to return order 123456, the soap is broken",
        ["start_return(order_id='123456', reason='the soap is broken')"],
        ["I've started return rtn005 for order 123456", "requested", "(the soap is broken)"],
    ),
    Case(
        "please start a return for 234567: wrong size",
        ["start_return(order_id='234567', reason='wrong size')"],
        ["Order 234567 already has an open return, rtn003", "processed by 2026-11-26"],
        absent=("started",),
    ),
    Case(
        "Send back my order 678901, I don't need it anymore.",
        ["start_return(order_id='678901', reason=\"I don't need it anymore\")"],
        ["Order 678901 already has an open return, rtn002", "Waiting for the item"],
    ),
    Case(
        "Hello, I'd like to return order 123456 because the bottle leaks",
        ["start_return(order_id='123456', reason='the bottle leaks')"],
        ["I've started return rtn005 for order 123456", "(the bottle leaks)"],
    ),
    Case(
        "I want to return order 456789, I no longer need it",
        ["start_return(order_id='456789', reason='I no longer need it')"],
        ["Order 456789 has not shipped yet, so it cannot be returned"],
    ),
    Case(
        "I want to return order 345678 because it is the wrong colour",
        ["start_return(order_id='345678', reason='it is the wrong colour')"],
        ["Order 345678 was already returned and refunded (return rtn001)"],
    ),
    Case(
        "I'd like to return order 123456.",
        [],
        ["I can start a return for order 123456. Please tell me why the item goes back."],
    ),
    Case(
        "It arrived damaged.",
        ["start_return(order_id='123456', reason='It arrived damaged')"],
        ["I've started return rtn005 for order 123456", "(It arrived damaged)"],
        before=("I'd like to return order 123456.",),
    ),
    Case(
        "The pump is broken.",
        ["start_return(order_id='123456', reason='The pump is broken')"],
        ["I've started return rtn005 for order 123456"],
        before=("Can I return order 123456?",),
    ),
    Case(
        "I want to return order 123456, the soap is broken",
        ["start_return(order_id='123456', reason='the soap is broken')"],
        # Said by the tool's check before consent in a turn, by the store's answer here.
        ["Order 123456 already has an open return, rtn005"],
        before=("I want to return order 123456, the soap is broken",),
        absent=("I've started",),
    ),
    # Follow-ups: the id the conversation was about.
    Case(
        "When will it arrive?",
        [ORDER_123456],
        ["Order 123456 shipped on 2026-11-18 and was due by 2026-11-21: it is 3 days late."],
        before=("Has order 123456 shipped?",),
    ),
    Case(
        "and what did it cost?",
        [ORDER_123456],
        ["order 123456 was $19.98"],
        before=("Has order 123456 shipped?", "When will it arrive?"),
    ),
    Case(
        "Has it been refunded?",
        ["return_status(return_id='rtn003')"],
        ["Not yet — return rtn003"],
        before=("When is my return rtn003 processed?",),
    ),
    Case(
        "And what did the order cost?",
        ["order_status(order_id='234567')"],
        ["order 234567 was $12.50"],
        before=("When is my return rtn003 processed?",),
    ),
    Case(
        "Can I return it?",
        ["order_status(order_id='234567')", policy("Can I return it?")],
        ["Order 234567", RETURNS_POLICY],
        before=("Has order 234567 shipped?",),
    ),
    Case(
        "Do you ship to Canada?",
        [policy("Do you ship to Canada?")],
        ["internationally to Canada"],
        before=("Has order 123456 shipped?",),
    ),
    Case(
        "456789",
        ["order_status(order_id='456789')"],
        ["No — order 456789 has not shipped yet"],
        before=("Has my order shipped?",),
    ),
    Case("When will it arrive?", [], ["Please tell me the order ID (6 digits, like 123456)."]),
    Case("How much did I pay?", [], ["Please tell me the order ID"]),
    # Small talk says what the agent can do; the rest is declined.
    Case("hi", [], ["Hello!", "status of a specific order", "policy documents"]),
    Case("Thanks!", [], ["You're welcome!", "status of a specific return"]),
    Case("Can you help me?", [], ["I can help with", "start a return"]),
    Case("Tell me a joke", [], [DECLINE]),
    Case("What's your favourite football team?", [], [DECLINE]),
    Case("Write me a poem about order 123456 and the ocean and the moon", [], [DECLINE]),
]


# --- what customers really ask -------------------------------------------------------

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

SITUATIONS = [
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


ALL = SEED + SITUATIONS


def problems(case: Case, calls: list[str], answer: str) -> list[str]:
    """What is wrong with a turn's calls and answer, for `case`; [] when right."""
    wrong = []
    if calls != case.calls:
        wrong.append(f"calls {calls}, expected {case.calls}")
    wrong += [f"missing {fact!r}" for fact in case.facts if fact not in answer]
    wrong += [f"should not say {text!r}" for text in case.absent if text in answer]
    return [f"{w} (answer: {answer!r})" for w in wrong]
