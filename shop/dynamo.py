"""The demo shop's orders and returns in DynamoDB (policies stay in SQLite FTS5).

    AGENT_SHOP_STORE=dynamodb                   use it (the worker's default store)
    AGENT_DYNAMO_PREFIX=durable-agent-          table names: <prefix>orders, <prefix>returns,
                                                <prefix>idempotency
    python -m shop.dynamo create                create the tables and load the sample data

Same contract as the SQLite store (`tests/test_stores.py` runs one suite on
both): lookups scoped to the customer, the return rules of `shop.store`, and
`start_return` exactly once per idempotency key.

DynamoDB cannot read and write in one transaction, so the rules are checked on
what was read and then made to hold by the write: each order item names its latest
return (`return_id`), and the transaction that writes a return also sets that
attribute on the condition that it is still absent. Of two requests that read
the order before either wrote, one wins; the other sees its condition fail,
reads again and answers with the winner's return.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from durable_agent.errors import NotFound, ToolUnavailable
from durable_agent.shop import seed
from durable_agent.shop.store import (
    ORDER_NOT_FOUND,
    RETURN_NOT_FOUND,
    Clock,
    Order,
    PolicyHit,
    Return,
    ShopStore,
    clean_reason,
    existing_return,
    make_order,
    new_return,
)

COUNTER_KEY = "__return_counter__"
# A lost race is followed by a fresh read, which sees the winner; more rounds
# than this mean something else is wrong, and Temporal retries the whole call.
_WRITE_ATTEMPTS = 3


class DynamoStore:
    def __init__(
        self,
        prefix: str | None = None,
        client: Any = None,
        policies: ShopStore | None = None,
        today: Clock = seed.today,
    ) -> None:
        prefix = (
            prefix
            if prefix is not None
            else os.environ.get("AGENT_DYNAMO_PREFIX", "durable-agent-")
        )
        self.orders_table, self.returns = f"{prefix}orders", f"{prefix}returns"
        self.idempotency = f"{prefix}idempotency"
        if client is None:
            import boto3

            client = boto3.client("dynamodb")
        self._db = client
        self._policies = policies or ShopStore()
        self.today = today

    # --- set-up -----------------------------------------------------------------

    def create_tables(self) -> None:
        for table, key in (
            (self.orders_table, "order_id"),
            (self.returns, "return_id"),
            (self.idempotency, "key"),
        ):
            try:
                self._db.create_table(
                    TableName=table,
                    KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                    AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                    BillingMode="PAY_PER_REQUEST",
                )
            except self._db.exceptions.ResourceInUseException:
                continue
            self._db.get_waiter("table_exists").wait(TableName=table)

    def seed(self) -> None:
        """Load the sample data; run again, it restores the sample facts and keeps
        the returns started since (an order keeps the `return_id` it was given)."""
        latest = {order_id: return_id for return_id, _, order_id, _, _ in seed.RETURNS}
        for oid, cust, item, qty, cents, status, shipped, expected in seed.ORDERS:
            self._db.update_item(
                TableName=self.orders_table,
                Key={"order_id": {"S": oid}},
                **_set(
                    customer_id=cust,
                    item=item,
                    quantity=qty,
                    total_cents=cents,
                    status=status,
                    shipped_on=shipped,
                    expected_delivery=expected,
                    return_id=latest.get(oid),
                ),
            )
        for rid, cust, oid, status, detail in seed.RETURNS:
            self._db.put_item(
                TableName=self.returns,
                Item=_item(
                    return_id=rid, customer_id=cust, order_id=oid, status=status, detail=detail
                ),
            )
        # New return ids continue after the sample ones, whatever was seeded before.
        last = max(int(return_id[3:]) for return_id, *_ in seed.RETURNS)
        self._db.update_item(
            TableName=self.idempotency,
            Key={"key": {"S": COUNTER_KEY}},
            UpdateExpression="SET n = if_not_exists(n, :n)",
            ExpressionAttributeValues={":n": {"N": str(last)}},
        )

    # --- the store contract ---------------------------------------------------------

    def order(self, customer_id: str, order_id: str) -> Order:
        row = self._get(self.orders_table, "order_id", order_id)
        if row is None or row["customer_id"] != customer_id:
            raise NotFound(ORDER_NOT_FOUND)
        return make_order(row, self.returns_for(order_id), self.today())

    def orders(self, customer_id: str) -> list[Order]:
        """The customer's orders, newest first (a scan: the demo's tables are small)."""
        pages = self._db.get_paginator("scan").paginate(
            TableName=self.orders_table,
            FilterExpression="customer_id = :c",
            ExpressionAttributeValues={":c": {"S": customer_id}},
            ConsistentRead=True,
        )
        rows = [_plain(i) for page in pages for i in page["Items"]]
        rows.sort(key=lambda r: (r.get("shipped_on") or "9999", r["order_id"]), reverse=True)
        returns = self._customer_returns(customer_id)
        today = self.today()
        return [
            make_order(row, [r for r in returns if r.order_id == row["order_id"]], today)
            for row in rows
        ]

    def return_(self, customer_id: str, return_id: str) -> Return:
        row = self._get(self.returns, "return_id", return_id)
        if row is None or row["customer_id"] != customer_id:
            raise NotFound(RETURN_NOT_FOUND)
        return _return(row)

    def start_return(
        self, customer_id: str, order_id: str, reason: str, idempotency_key: str
    ) -> Return:
        """Start a return for one of the customer's orders, exactly once per key,
        and at most one open return per order (see the module docstring)."""
        for _ in range(_WRITE_ATTEMPTS):
            done = self._done(idempotency_key)
            if done is not None:
                return done
            order = self._get(self.orders_table, "order_id", order_id)
            if order is None or order["customer_id"] != customer_id:
                raise NotFound(ORDER_NOT_FOUND)
            ret = existing_return(order_id, order["status"], self._latest_return(order))
            if ret is not None:
                if self._remember(idempotency_key, ret.return_id):
                    return ret
                continue  # a call with this key just finished: its result is read above
            cleaned = clean_reason(order_id, reason)
            ret = new_return(self._next_return_id(), order_id, cleaned, self.today())
            if self._write(customer_id, ret, idempotency_key):
                return ret
        raise ToolUnavailable("The return could not be recorded just now; retrying.")

    def returns_for(self, order_id: str) -> list[Return]:
        pages = self._db.get_paginator("scan").paginate(
            TableName=self.returns,
            FilterExpression="order_id = :o",
            ExpressionAttributeValues={":o": {"S": order_id}},
            ConsistentRead=True,
        )
        return [_return(_plain(i)) for page in pages for i in page["Items"]]

    def _customer_returns(self, customer_id: str) -> list[Return]:
        pages = self._db.get_paginator("scan").paginate(
            TableName=self.returns,
            FilterExpression="customer_id = :c",
            ExpressionAttributeValues={":c": {"S": customer_id}},
            ConsistentRead=True,
        )
        return [_return(_plain(i)) for page in pages for i in page["Items"]]

    def search_policies(self, query: str, limit: int = 2) -> list[PolicyHit]:
        return self._policies.search_policies(query, limit)

    # --- helpers ----------------------------------------------------------------------

    def _get(self, table: str, key: str, value: str) -> dict[str, Any] | None:
        item = self._db.get_item(TableName=table, Key={key: {"S": value}}, ConsistentRead=True).get(
            "Item"
        )
        return _plain(item) if item else None

    def _done(self, idempotency_key: str) -> Return | None:
        row = self._get(self.idempotency, "key", idempotency_key)
        if row is None:
            return None
        ret = self._get(self.returns, "return_id", row["return_id"])
        return _return(ret) if ret else None

    def _latest_return(self, order: dict[str, Any]) -> Return | None:
        if "return_id" not in order:
            return None
        row = self._get(self.returns, "return_id", order["return_id"])
        return _return(row) if row else None

    def _next_return_id(self) -> str:
        n = self._db.update_item(
            TableName=self.idempotency,
            Key={"key": {"S": COUNTER_KEY}},
            UpdateExpression="ADD n :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
            ReturnValues="UPDATED_NEW",
        )["Attributes"]["n"]["N"]
        return f"rtn{int(n):03d}"

    def _remember(self, idempotency_key: str, return_id: str) -> bool:
        """Tie the key to an existing return, so a re-run gets what this call got;
        False if another call with the key got there first."""
        try:
            self._db.put_item(
                TableName=self.idempotency,
                Item=_item(key=idempotency_key, return_id=return_id),
                ConditionExpression="attribute_not_exists(#k)",
                ExpressionAttributeNames={"#k": "key"},
            )
        except self._db.exceptions.ConditionalCheckFailedException:
            return False
        return True

    def _write(self, customer_id: str, ret: Return, idempotency_key: str) -> bool:
        """Write the key, the return and the order's `return_id` together or not at
        all; False if the key was used or the order got a return since it was read."""
        try:
            self._db.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self.idempotency,
                            "Item": _item(key=idempotency_key, return_id=ret.return_id),
                            "ConditionExpression": "attribute_not_exists(#k)",
                            "ExpressionAttributeNames": {"#k": "key"},
                        }
                    },
                    {
                        "Put": {
                            "TableName": self.returns,
                            "Item": _item(customer_id=customer_id, **ret.model_dump()),
                            "ConditionExpression": "attribute_not_exists(return_id)",
                        }
                    },
                    {
                        "Update": {
                            "TableName": self.orders_table,
                            "Key": {"order_id": {"S": ret.order_id}},
                            "UpdateExpression": "SET return_id = :r",
                            "ConditionExpression": "attribute_exists(order_id) "
                            "AND attribute_not_exists(return_id)",
                            "ExpressionAttributeValues": {":r": {"S": ret.return_id}},
                        }
                    },
                ]
            )
        except self._db.exceptions.TransactionCanceledException:
            return False
        return True


def _item(**values: Any) -> dict[str, Any]:
    return {
        k: {"N": str(v)} if isinstance(v, int) else {"S": str(v)}
        for k, v in values.items()
        if v is not None
    }


def _set(**values: Any) -> dict[str, Any]:
    """update_item arguments that set the given attributes (None ones are left alone)."""
    values = {k: v for k, v in values.items() if v is not None}
    return {
        "UpdateExpression": "SET " + ", ".join(f"#{k} = :{k}" for k in values),
        "ExpressionAttributeNames": {f"#{k}": k for k in values},
        "ExpressionAttributeValues": {f":{k}": v for k, v in _item(**values).items()},
    }


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    return {k: next(iter(v.values())) for k, v in item.items()}


def _return(row: dict[str, Any]) -> Return:
    return Return(
        return_id=row["return_id"],
        order_id=row["order_id"],
        status=row["status"],
        detail=row["detail"],
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m shop.dynamo")
    p.add_argument("command", choices=["create"], help="create the tables and load sample data")
    p.parse_args()
    store = DynamoStore()
    store.create_tables()
    store.seed()
    print(f"tables ready: {store.orders_table}, {store.returns}, {store.idempotency}")


if __name__ == "__main__":
    main()
