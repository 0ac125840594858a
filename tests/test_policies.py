"""Policy search: the right document first, and excerpts of whole sentences."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from durable_agent.errors import NotFound
from durable_agent.shop import seed
from durable_agent.shop.store import POLICY_NOT_FOUND, ShopStore

RETURNS, REFUNDS, SHIPPING = "Returns", "Refunds", "Shipping and delivery"
PAYMENT, WARRANTY = "Payment and cancellations", "Warranty"
PROBLEMS = "Damaged, wrong or missing items"

# question, the document that must come first, words its excerpt must contain
QUERIES = [
    ("returning orders", RETURNS, "within 30 days"),
    ("return policy", RETURNS, "within 30 days"),
    ("What is your return policy?", RETURNS, "within 30 days"),
    ("RETURN POLICY!!!", RETURNS, "within 30 days"),
    ("How many days do I have to return an item?", RETURNS, "30 days"),
    ("Can I send back an opened soap?", RETURNS, "only if they are faulty"),
    ("I want to return something I bought", RETURNS, "full refund"),
    ("Do you ship to Canada?", SHIPPING, "Canada"),
    ("What is your shipping policy?", SHIPPING, "Orders ship within 2 business days"),
    ("Do you ship internationally?", SHIPPING, "United Kingdom"),
    ("Do you deliver to the UK?", SHIPPING, "United Kingdom"),
    ("How much does express delivery cost?", SHIPPING, "$9.95"),
    ("Where is my tracking number?", SHIPPING, "tracking number"),
    ("How long does a refund take?", REFUNDS, "3 to 5 business days"),
    ("When will I get my money back?", REFUNDS, "money back"),
    ("Are shipping costs refunded?", REFUNDS, "Shipping costs are refunded only"),
    ("refund card", REFUNDS, "Card refunds"),
    ("Which payment methods do you accept?", PAYMENT, "PayPal"),
    ("Can I pay with PayPal?", PAYMENT, "PayPal"),
    ("When is my card charged?", PAYMENT, "charged when the order ships"),
    ("Can I cancel my order?", PAYMENT, "cancel"),
    ("How do I cancel an order that has not shipped?", PAYMENT, "before it ships"),
    ("Is there a warranty on electric toothbrushes?", WARRANTY, "one-year warranty"),
    ("My toothbrush stopped working", WARRANTY, "replace it free of charge"),
    ("Is there a guarantee on devices?", WARRANTY, "devices"),
    ("My parcel arrived damaged, what can I do?", PROBLEMS, "full refund, shipping included"),
    ("I received the wrong item", PROBLEMS, "not what you ordered"),
    ("My parcel is lost, it never arrived", PROBLEMS, "treated as lost"),
]

BODIES = {title: body for _, title, body in seed.policies()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ShopStore:
    return ShopStore(tmp_path_factory.mktemp("policies") / "shop.db")


def assert_whole_sentences(excerpt: str, body: str) -> None:
    """Each sentence of the excerpt is one of the document's, from its first word to
    its final stop: nothing cut at either end."""
    assert excerpt[:1].isupper() and excerpt.endswith((".", "!", "?")), excerpt
    for sentence in re.split(r"(?<=[.!?]) (?=[A-Z])", excerpt):
        start = body.find(sentence)
        assert start >= 0, f"not in the document: {sentence!r}"
        end = start + len(sentence)
        assert start == 0 or body[start - 2 : start] in (". ", "! ", "? "), sentence
        assert end == len(body) or body[end] == " ", sentence


@pytest.mark.parametrize(("query", "title", "words"), QUERIES, ids=[q for q, *_ in QUERIES])
def test_the_right_document_comes_first(store: ShopStore, query: str, title: str, words: str):
    hits = store.search_policies(query)
    assert [h.title for h in hits][0] == title
    assert words in hits[0].excerpt
    assert len({h.title for h in hits}) == len(hits) <= 2
    for hit in hits:
        assert_whole_sentences(hit.excerpt, BODIES[hit.title])


def test_the_query_table_covers_every_document() -> None:
    assert {title for _, title, _ in QUERIES} == set(BODIES)


def test_a_question_about_the_topic_gets_the_opening_sentence(store: ShopStore) -> None:
    """The opening sentence states the policy, though others repeat "return" more."""
    excerpt = store.search_policies("What is your return policy?")[0].excerpt
    assert excerpt.startswith(BODIES[RETURNS].split(". ")[0] + ".")


def test_search_operators_typed_by_a_customer_are_plain_words(store: ShopStore) -> None:
    hits = store.search_policies('refund" OR * NOT (card: NEAR')
    assert hits[0].title == REFUNDS


@pytest.mark.parametrize(
    "query", ["What is your policy?", "How is the weather in Scotland right now?", "?!"]
)
def test_nothing_to_match_is_not_found(store: ShopStore, query: str) -> None:
    with pytest.raises(NotFound, match=re.escape(POLICY_NOT_FOUND)):
        store.search_policies(query)


def test_limit(store: ShopStore) -> None:
    assert len(store.search_policies("refund shipping payment", limit=1)) == 1
    assert len(store.search_policies("refund shipping payment warranty returns", limit=5)) == 5


def test_an_older_index_is_rebuilt(tmp_path: Path) -> None:
    """A file from a version with another index (or other documents) gets today's."""
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE VIRTUAL TABLE policies USING fts5(slug UNINDEXED, title, body)")
        db.execute("INSERT INTO policies VALUES ('shipping', 'Shipping', 'We ship nowhere.')")
    store = ShopStore(path)
    assert store.search_policies("Do you ship to Canada?")[0].title == SHIPPING
    assert tables(path) >= {"policy_text"} and "policies" not in tables(path)


def test_an_index_of_todays_documents_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    ShopStore(path)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO policy_text VALUES ('extra', 0, 'Gift wrapping', '')")
    ShopStore(path)  # several workers open the file; only a change rebuilds the index
    assert ShopStore(path).search_policies("gift wrapping")[0].title == "Gift wrapping"


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
