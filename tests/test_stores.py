"""One contract, two stores: the demo shop on SQLite and on DynamoDB (moto)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from agent.errors import NotAllowed, NotFound
from shop.dynamo import DynamoStore
from shop.store import ShopData, ShopStore


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ShopData]:
    sqlite = ShopStore(tmp_path / "shop.db")
    if request.param == "sqlite":
        yield sqlite
        return
    with mock_aws():
        client = boto3.client(
            "dynamodb", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
        )
        dynamo = DynamoStore(prefix="test-", client=client, policies=sqlite)
        dynamo.create_tables()
        dynamo.seed()
        yield dynamo


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


def test_start_return_is_exactly_once_per_key(store: ShopData) -> None:
    first = store.start_return("demo", "123456", "damaged", "wf-1/1/0")
    again = store.start_return("demo", "123456", "damaged", "wf-1/1/0")
    assert again == first
    assert first.return_id == "rtn005" and first.status == "requested"
    other = store.start_return("demo", "123456", "second item", "wf-2/1/0")
    assert other.return_id == "rtn006"
    assert sorted(r.return_id for r in store.returns_for("123456")) == ["rtn005", "rtn006"]


def test_concurrent_calls_with_one_key_write_once(store: ShopData) -> None:
    results = []

    def call() -> None:
        results.append(store.start_return("demo", "234567", "wrong size", "wf-9/1/0"))

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.return_id for r in results}) == 1
    new = [r for r in store.returns_for("234567") if r.status == "requested"]
    assert len(new) == 1


def test_start_return_rules(store: ShopData) -> None:
    with pytest.raises(NotAllowed, match="has not shipped yet"):
        store.start_return("demo", "456789", "changed my mind", "k1")
    with pytest.raises(NotFound):
        store.start_return("demo", "567890", "not mine", "k2")


def test_policies(store: ShopData) -> None:
    assert store.search_policies("how long does a refund take")[0].title == "Refunds"
