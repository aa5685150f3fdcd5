"""Storage keys, items and conditions as DynamoDB attribute maps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base import Expect, Item, RequestRejected
from .layout import KeyLayout
from .table import PARTITION_KEY, SORT_KEY, VALUE, VERSION

Attributes = dict[str, Any]

ITEM_PK_PREFIX = "k:"
DIRECTORY_PK = "d:"
#: Sort key of a key that ends exactly at its partition head ("a/" in "a/").
#: Key attributes cannot be empty; NUL sorts before every other rest, and
#: keys never contain NUL (the domain refuses it, and so does `KeyCodec`).
EMPTY_REST = "\x00"
MAX_SORT_KEY_BYTES = 1024


def encode_rest(rest: str) -> str:
    return rest or EMPTY_REST


def decode_rest(sort_key: str) -> str:
    return "" if sort_key == EMPTY_REST else sort_key


@dataclass(frozen=True, slots=True)
class KeyCodec:
    layout: KeyLayout

    def split(self, key: str) -> tuple[str, str]:
        if "\x00" in key:
            raise RequestRejected(f"key {key!r} contains NUL, which the DynamoDB layout reserves")
        partition, rest = self.layout.split(key)
        # a partition's name is also the sort key of its directory entry
        if len(rest.encode()) > MAX_SORT_KEY_BYTES or len(partition.encode()) > MAX_SORT_KEY_BYTES:
            raise RequestRejected(f"key of {len(key.encode())} bytes does not fit DynamoDB's key limits")
        return partition, rest

    def key_attributes(self, key: str) -> tuple[str, Attributes]:
        """(partition, primary-key attributes) of a storage key."""
        partition, rest = self.split(key)
        return partition, {
            PARTITION_KEY: {"S": ITEM_PK_PREFIX + partition},
            SORT_KEY: {"S": encode_rest(rest)},
        }


def item_from(attrs: Attributes) -> Item:
    key = attrs[PARTITION_KEY]["S"][len(ITEM_PK_PREFIX):] + decode_rest(attrs[SORT_KEY]["S"])
    value = attrs.get(VALUE, {}).get("B", b"")
    return Item(key, bytes(value), attrs.get(VERSION, {}).get("S", ""))


def key_from(attrs: Attributes) -> str:
    return attrs[PARTITION_KEY]["S"][len(ITEM_PK_PREFIX):] + decode_rest(attrs[SORT_KEY]["S"])


def attributes_bytes(attrs: Attributes) -> int:
    """An item's size as DynamoDB counts it against its limits: every
    attribute's name plus its value (UTF-8 for strings)."""
    return sum(len(name) + (len(v["B"]) if "B" in v else len(v["S"].encode())) for name, v in attrs.items())


def transaction_bytes(items: list[Attributes]) -> int:
    """TransactWriteItems entries' aggregate item size as DynamoDB counts it
    against its 4 MB limit (keys of checks and deletes too), so more than the
    storage contract's keys plus values."""
    return sum(attributes_bytes(body.get("Item") or body["Key"]) for entry in items for body in entry.values())


def entry_label(entry: Attributes) -> str:
    """A TransactWriteItems entry as a log names it: its kind and key."""
    kind, body = next(iter(entry.items()))
    attrs = body.get("Item") or body.get("Key") or {}
    partition, sort = attrs.get(PARTITION_KEY, {}).get("S", ""), attrs.get(SORT_KEY, {}).get("S", "")
    if partition == DIRECTORY_PK:
        return f"{kind} of the directory entry of partition {sort!r}"
    return f"{kind} {key_from(attrs)!r}" if partition else kind


def directory_put(table: str, partition: str) -> Attributes:
    """The TransactWriteItems entry recording that `partition` exists."""
    return {"Put": {"TableName": table, "Item": {
        PARTITION_KEY: {"S": DIRECTORY_PK}, SORT_KEY: {"S": partition},
    }}}


@dataclass
class Condition:
    """A ConditionExpression with its placeholder maps (only the names used)."""

    clauses: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    #: a put under this condition can create the item (and so its partition)
    may_create: bool = True

    @classmethod
    def of_absent(cls) -> Condition:
        return cls.of(Expect(exists=False))

    @classmethod
    def of_version(cls, expected: str) -> Condition:
        return cls.of(Expect(version=expected))

    @classmethod
    def of(cls, expect: Expect | None) -> Condition:
        cond = cls()
        if expect is None:
            return cond
        cond.may_create = expect.exists is not True and expect.version is None and expect.value is None
        if expect.exists is True:
            cond.clauses.append(f"attribute_exists({PARTITION_KEY})")
        elif expect.exists is False:
            cond.clauses.append(f"attribute_not_exists({PARTITION_KEY})")
        if expect.version is not None:
            cond.clauses.append("#ver = :ver")
            cond.names["#ver"] = VERSION
            cond.values[":ver"] = {"S": expect.version}
        if expect.value is not None:
            cond.clauses.append("#val = :val")
            cond.names["#val"] = VALUE
            cond.values[":val"] = {"B": expect.value}
        return cond

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        """Add the condition to a PutItem / DeleteItem / transaction entry."""
        if self.clauses:
            request["ConditionExpression"] = " AND ".join(self.clauses)
            if self.names:
                request["ExpressionAttributeNames"] = self.names
            if self.values:
                request["ExpressionAttributeValues"] = self.values
        return request

