"""Customer questions through the offline model, with the real shop tools and a
real store: which calls it plans, and the facts its answer must state.

Each row runs the way a turn does (plan, the calls through the registry,
rendered results, interpret), in a chat of its own: the questions in `before`
are asked (and answered) first, and reach the model as earlier messages. The
rows are checked together and every failing row is reported, with what was
wrong, in one assertion at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from durable_agent.answers import DECLINE
from durable_agent.conversation import AssistantMessage, Message, ToolResult, UserMessage, check
from durable_agent.errors import InvalidCall, ToolError
from durable_agent.model import ModelRequest
from durable_agent.render import render_result
from durable_agent.tools import ToolContext
from shop import TOOLS, ShopStore
from shop.agent import INSTRUCTIONS
from shop.phrasebook import offline_model
from shop.store import ORDER_NOT_FOUND, RETURN_NOT_FOUND

_json = TypeAdapter(Any)


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

CASES = [
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
        ["Order 123456 already has an open return, rtn005", "so I did not start a new one"],
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


@dataclass(frozen=True)
class Turn:
    calls: list[str]
    answer: str


class Chat:
    """One customer's chat, driven the way the turn workflow drives a model."""

    def __init__(self, store: ShopStore, name: str) -> None:
        self.model = offline_model()
        self.store = store
        self.name = name
        self.history: list[Message] = []

    async def ask(self, question: str) -> Turn:
        messages: list[Message] = [*self.history, UserMessage(text=question)]
        reply = await self._model("plan", messages)
        calls = [c.render() for c in reply.calls]
        if reply.calls:
            messages.append(reply.message())
            messages += [self._run(i, call) for i, call in enumerate(reply.calls)]
            reply = await self._model("interpret", messages)
            if reply.calls:
                raise AssertionError(f"interpret asked for more calls: {reply.calls}")
        self.history += [UserMessage(text=question), AssistantMessage(text=reply.text)]
        return Turn(calls, reply.text)

    async def _model(self, step: str, messages: list[Message]) -> Any:
        check(messages)  # the conversation every provider would accept
        request = ModelRequest(messages=messages, tools=TOOLS.specs, instructions=INSTRUCTIONS)
        return await getattr(self.model, step)(request)

    def _run(self, index: int, call: Any) -> ToolResult:
        """Validate, call and render as parse, dispatch and parse_output do."""
        key = f"{self.name}/{len(self.history)}/{index}"
        try:
            args = TOOLS.validate(call)
            result = TOOLS[call.name](args, ToolContext("demo", self.store, key))
        except (InvalidCall, ToolError) as e:
            return ToolResult(call_id=call.id, tool=call.name, ok=False, text=str(e))
        text = render_result(_json.dump_python(result, mode="json"))
        return ToolResult(call_id=call.id, tool=call.name, ok=True, text=text)


async def run_case(case: Case, db: Path) -> Turn:
    chat = Chat(ShopStore(db), db.stem)
    for earlier in case.before:
        await chat.ask(earlier)
    return await chat.ask(case.question)


def problems(case: Case, turn: Turn) -> list[str]:
    wrong = []
    if turn.calls != case.calls:
        wrong.append(f"calls {turn.calls}, expected {case.calls}")
    wrong += [f"missing {fact!r}" for fact in case.facts if fact not in turn.answer]
    wrong += [f"should not say {text!r}" for text in case.absent if text in turn.answer]
    return [f"{w} (answer: {turn.answer!r})" for w in wrong]


async def test_customer_questions(tmp_path: Path) -> None:
    failures = []
    for i, case in enumerate(CASES):
        turn = await run_case(case, tmp_path / f"chat{i}.db")
        failures += [(case.question, wrong) for wrong in problems(case, turn)]
    report = "\n".join(f"- {question!r}: {wrong}" for question, wrong in failures)
    assert not failures, f"{len(failures)} problem(s) in {len(CASES)} questions:\n{report}"


def test_the_table_is_wide() -> None:
    assert len(CASES) >= 40
    assert len({(c.before, c.question) for c in CASES}) == len(CASES)
