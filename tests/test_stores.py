"""One contract, two stores: the demo shop on SQLite and on DynamoDB (moto)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from durable_agent.errors import NotAllowed, NotFound
from durable_agent.shop import seed
from durable_agent.shop.dynamo import DynamoStore
from durable_agent.shop.store import MAX_REASON_CHARS, Return, ShopData, ShopStore


class Serialized:
    """A boto3 client whose calls run one at a time. DynamoDB applies each request
    atomically; moto applies a transaction item by item without a lock, so two
    threads could interleave inside one request. Serializing the calls restores
    DynamoDB's atomicity and leaves the races *between* requests, the ones the
    store must handle."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return call


@pytest.fixture
def dynamo(tmp_path: Path) -> Iterator[DynamoStore]:
    with mock_aws():
        client = boto3.client(
            "dynamodb", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        store = DynamoStore(
            prefix="test-", client=Serialized(client), policies=ShopStore(tmp_path / "shop.db")
        )
        store.create_tables()
        store.seed()
        yield store


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ShopData:
    if request.param == "sqlite":
        return ShopStore(tmp_path / "shop.db")
    return request.getfixturevalue("dynamo")  # type: ignore[no-any-return]


def reopen(store: ShopData) -> None:
    """What a restarted worker (SQLite) or a second `python -m shop.dynamo create` does."""
    if isinstance(store, DynamoStore):
        store.seed()
    else:
        assert isinstance(store, ShopStore)
        ShopStore(store.path)


def in_parallel(n: int, call: Callable[[int], Return]) -> list[Return]:
    """`call(i)` for i in 0..n-1, all released at once."""
    start, results = threading.Barrier(n), []

    def run(i: int) -> None:
        start.wait()
        results.append(call(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == n  # no thread died
    return results


# --- lookups ------------------------------------------------------------------------------


def test_orders_are_scoped_to_their_customer(store: ShopData) -> None:
    assert store.order("demo", "123456").item == "Herbal Handsoap"
    assert store.order("demo", "123456").total == "$19.98"
    for customer, order_id in (("cust-002", "123456"), ("demo", "567890"), ("demo", "999999")):
        with pytest.raises(NotFound, match="Order not found. Please check your Order ID."):
            store.order(customer, order_id)


def test_returns_are_scoped_to_their_customer(store: ShopData) -> None:
    assert store.return_("demo", "rtn003").status == "received"
    with pytest.raises(NotFound, match="Return not found"):
        store.return_("demo", "rtn004")


def test_policies(store: ShopData) -> None:
    assert store.search_policies("how long does a refund take")[0].title == "Refunds"


# --- start_return: exactly once, one open return per order ---------------------------------


def test_start_return_is_exactly_once_per_key(store: ShopData) -> None:
    first = store.start_return("demo", "123456", "arrived damaged", "wf-1/1/0")
    again = store.start_return("demo", "123456", "arrived damaged", "wf-1/1/0")
    assert again == first
    assert first.return_id == "rtn005" and first.status == "requested"
    assert "(arrived damaged)" in first.detail
    assert store.returns_for("123456") == [first]


def test_a_repeated_request_gets_the_open_return(store: ShopData) -> None:
    first = store.start_return("demo", "123456", "arrived damaged", "wf-1/1/0")
    again = store.start_return("demo", "123456", "the lid is cracked", "wf-2/1/0")
    assert again == first
    assert store.returns_for("123456") == [first]
    # The second key now names that return too: its re-run gets the same answer.
    assert store.start_return("demo", "123456", "anything", "wf-2/1/0") == first


def test_an_open_sample_return_is_answered_not_duplicated(store: ShopData) -> None:
    ret = store.start_return("demo", "234567", "wrong size", "wf-3/1/0")
    assert (ret.return_id, ret.status) == ("rtn003", "received")
    assert sorted(r.return_id for r in store.returns_for("234567")) == ["rtn003"]


def test_a_refunded_order_cannot_be_returned_again(store: ShopData) -> None:
    with pytest.raises(NotAllowed) as refused:
        store.start_return("demo", "345678", "changed my mind", "wf-4/1/0")
    assert str(refused.value) == (
        "Order 345678 was already returned and refunded (return rtn001), so it cannot be "
        "returned again; ask about return rtn001 for the refund's details."
    )
    assert [r.return_id for r in store.returns_for("345678")] == ["rtn001"]


def test_an_unshipped_order_cannot_be_returned(store: ShopData) -> None:
    with pytest.raises(NotAllowed) as refused:
        store.start_return("demo", "456789", "changed my mind", "wf-5/1/0")
    assert str(refused.value) == (
        "Order 456789 has not shipped yet, so it cannot be returned; "
        "you can cancel it free of charge until it ships instead."
    )
    assert store.returns_for("456789") == []


def test_only_the_customers_own_orders_can_be_returned(store: ShopData) -> None:
    for order_id in ("567890", "999999"):
        with pytest.raises(NotFound, match="Order not found"):
            store.start_return("demo", order_id, "not mine", f"wf-6/{order_id}")
    assert [r.return_id for r in store.returns_for("567890")] == ["rtn004"]


# --- the reason -------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["", "   ", "\n\t", " ... ", "\x00\x07"])
def test_a_blank_reason_is_refused_and_writes_nothing(store: ShopData, reason: str) -> None:
    with pytest.raises(NotAllowed, match=r"^Please say why order 123456 is going back"):
        store.start_return("demo", "123456", reason, "wf-7/1/0")
    assert store.returns_for("123456") == []
    # The key was not used up: the customer's next try with a reason goes through.
    assert store.start_return("demo", "123456", "too small", "wf-7/1/0").status == "requested"


def test_the_reason_is_kept_on_one_line(store: ShopData) -> None:
    ret = store.start_return(
        "demo", "123456", "  Arrived\n\tdamaged:\r\n the lid\x00 is cracked. ", "k"
    )
    assert "(Arrived damaged: the lid is cracked)" in ret.detail


def test_a_long_reason_is_capped_at_a_word_boundary(store: ShopData) -> None:
    words = [f"word{i}" for i in range(100)]
    ret = store.start_return("demo", "123456", " ".join(words), "k")
    kept = ret.detail[ret.detail.index("(") + 1 : ret.detail.index(")")]
    assert len(kept) <= MAX_REASON_CHARS and kept.endswith("…")
    assert kept[:-1].split() == words[: len(kept[:-1].split())]  # whole words only
    assert len(kept) > MAX_REASON_CHARS - len("word99 …")  # and not much shorter


# --- concurrency and re-opening -----------------------------------------------------------


@pytest.mark.parametrize("keys", ["one key", "a key each"])
def test_concurrent_requests_create_one_return(store: ShopData, keys: str) -> None:
    def call(i: int) -> Return:
        key = "wf-9/1/0" if keys == "one key" else f"wf-9/{i}/0"
        return store.start_return("demo", "123456", "wrong size", key)

    results = in_parallel(6, call)
    assert len({r.return_id for r in results}) == 1
    assert [r.return_id for r in store.returns_for("123456")] == [results[0].return_id]


def test_reopening_keeps_returns_and_rules(store: ShopData) -> None:
    first = store.start_return("demo", "123456", "arrived damaged", "wf-1/1/0")
    reopen(store)
    assert store.start_return("demo", "123456", "again", "wf-2/1/0") == first
    assert store.returns_for("123456") == [first]
    assert store.return_("demo", "rtn003").status == "received"


def test_dynamo_request_that_loses_a_race_answers_with_the_winner(
    dynamo: DynamoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rival's whole request lands between this request's read and its write:
    the conditional transaction refuses the second return."""
    real_write = dynamo._write
    rival: list[Return] = []

    def write_after_rival(customer_id: str, ret: Return, idempotency_key: str) -> bool:
        monkeypatch.setattr(dynamo, "_write", real_write)
        rival.append(dynamo.start_return("demo", "123456", "rival", "rival-key"))
        return real_write(customer_id, ret, idempotency_key)

    monkeypatch.setattr(dynamo, "_write", write_after_rival)
    ret = dynamo.start_return("demo", "123456", "mine", "my-key")
    assert ret == rival[0]
    assert dynamo.returns_for("123456") == [ret]
    assert dynamo.start_return("demo", "123456", "mine", "my-key") == ret


def test_an_older_sqlite_file_gets_todays_sample_facts(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    ShopStore(path)
    with sqlite3.connect(path) as db:  # rtn002 sat on order 234567 before
        db.execute("UPDATE returns SET order_id = '234567' WHERE return_id = 'rtn002'")
    store = ShopStore(path)
    assert [r.return_id for r in store.returns_for("234567")] == ["rtn003"]
    assert [r.return_id for r in store.returns_for("678901")] == ["rtn002"]


def test_a_customer_lists_only_their_own_orders_newest_first(store: ShopData) -> None:
    orders = store.orders("demo")
    assert [o.order_id for o in orders] == ["456789", "123456", "678901", "234567", "345678"]
    assert [o.order_id for o in store.orders("cust-002")] == ["567890"]
    assert store.orders("nobody") == []
    listed = {o.order_id: o for o in orders}
    assert listed["345678"] == store.order("demo", "345678")


def test_an_order_is_late_by_the_stores_clock(store: ShopData) -> None:
    # The sample data's today (2026-11-24): 123456 was due on the 21st.
    assert store.order("demo", "123456").days_late == 3
    assert store.order("demo", "456789").days_late is None  # due on the 27th
    assert store.order("demo", "234567").days_late is None  # delivered


def test_the_clock_is_the_stores_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    later = ShopStore(tmp_path / "shop.db", today=lambda: date(2026, 11, 28))
    assert later.order("demo", "456789").days_late == 1
    assert later.order("demo", "123456").days_late == 7
    created = later.start_return("demo", "123456", "arrived damaged", "key-1")
    assert created.detail.startswith("Requested on 2026-11-28 (arrived damaged).")
    monkeypatch.setenv("AGENT_SHOP_TODAY", "2026-12-01")
    assert seed.today() == date(2026, 12, 1)
    monkeypatch.setenv("AGENT_SHOP_TODAY", "system")
    assert seed.today() == date.today()
    monkeypatch.setenv("AGENT_SHOP_TODAY", "yesterday")
    with pytest.raises(ValueError, match="AGENT_SHOP_TODAY='yesterday': use a date"):
        seed.today()
