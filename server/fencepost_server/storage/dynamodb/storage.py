"""DynamoStorage: the storage contract over one DynamoDB table (aioboto3).

Layout (see layout.py for the partition rules, listing.py for lists):

    item       pk = "k:" + partition head   sk = rest of the key ("\\0" if empty)
               val = value (B), ver = version (S)
    directory  pk = "d:"                    sk = partition head

Cost per call, steady state: get, put, delete and each CAS are one request
(GetItem / PutItem / DeleteItem; a failed condition returns the current item
through ReturnValuesOnConditionCheckFailure=ALL_OLD, a delete its old item
through ReturnValues=ALL_OLD). `transact` is one TransactWriteItems (with
`CountKeys`, plus one keys-only Query sent alongside it). The
first write that may create an item in a partition this process has not
seen yet goes out as a TransactWriteItems that also writes the partition's
directory entry: still one request, and the directory entry exists before
any item of the partition can. The process then trusts the entry for
`partition_cache_ttl` seconds (30 by default), so that an erasure can remove
the entries naming its scope (directory.py). A list page over a prefix that
pins one partition is one Query.

Versions are 128 random bits made by the writer, so an attempt can recognise
its own write: when a retried conditional write fails and the current item
carries the version this call generated, an earlier attempt landed and the
call reports success (real DynamoDB also honours ClientRequestToken on
transactions; the local test server does not, so nothing relies on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from ..base import (
    EXPORT_PAGE,
    MAX_TXN_BYTES,
    BackendUnavailable,
    CasResult,
    Check,
    CountKeys,
    Delete,
    InvalidTransaction,
    Item,
    Put,
    Storage,
    TxnResult,
    Write,
    highest_per_family,
    new_version,
    random_hex,
    validate_transaction,
)
from . import bulk, directory, listing
from .codec import (
    Condition,
    KeyCodec,
    directory_put,
    item_from,
    key_from,
    transaction_bytes,
)
from .errors import Ambiguous, RetryPolicy, error_code, with_retries
from .layout import KeyLayout
from .table import VALUE, VERSION, create_table

MAX_TRANSACT_ITEMS = 100
_CONDITION_FAILED = "ConditionalCheckFailed"


class DynamoStorage(Storage):
    scheme = "dynamodb"

    def __init__(
        self,
        table: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_connections: int = 64,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        retry: RetryPolicy | None = None,
        layout: KeyLayout | None = None,
        known_partitions: int = 100_000,
        partition_cache_ttl: float = directory.DEFAULT_TTL,
        in_flight_seconds: float | None = None,
    ) -> None:
        self.table = table
        self.endpoint_url = endpoint_url
        self.region = region
        self.retry = retry or RetryPolicy()
        self.codec = KeyCodec(layout or KeyLayout())
        self._config = AioConfig(
            max_pool_connections=max_connections,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"total_max_attempts": 1},  # errors.with_retries decides
        )
        self._client: Any = None
        self._client_context: Any = None
        self._client_lock = asyncio.Lock()
        self._closed = False
        # Partitions whose directory entry this process wrote, trusted for a while (directory.py).
        self._known = directory.KnownPartitions(known_partitions, partition_cache_ttl)
        # The longest a sent attempt can take to be applied: the one attempt's
        # timeouts (botocore's own retries are off), unless told otherwise.
        self._in_flight = connect_timeout + read_timeout if in_flight_seconds is None else in_flight_seconds
        # The stored version watermarks as last read or written (bulk.py);
        # None until the first import of this process needs them.
        self._watermarks: dict[str, tuple[int, str]] | None = None
        self._bulk_gate = asyncio.Semaphore(bulk.IN_FLIGHT)  # BatchWriteItem requests in flight
        # Reservations read, merge and write one item: concurrent imports take turns,
        # or a lower watermark written last undoes a higher one.
        self._watermarks_lock = asyncio.Lock()

    @classmethod
    def from_params(cls, table: str, params: dict[str, str]) -> DynamoStorage:
        """`dynamodb://TABLE?endpoint=URL&region=R&pool=N&connect_timeout=S&read_timeout=S&attempts=N`
        `&partition_cache_ttl=S`."""
        known = {"endpoint", "region", "pool", "connect_timeout", "read_timeout", "attempts", "partition_cache_ttl"}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown dynamodb URL parameter(s): {', '.join(sorted(unknown))}")
        endpoint = params.get("endpoint") or None
        if endpoint is not None:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                # botocore takes it and every call fails ("Invalid endpoint"): refused at start-up
                raise ValueError(f"dynamodb URL parameter endpoint={endpoint!r}: expected http://HOST:PORT "
                                 "or https://HOST")
        return cls(
            table,
            endpoint_url=endpoint,
            region=params.get("region") or None,
            max_connections=_url_number(params, "pool", 64, int, 1),
            connect_timeout=_url_number(params, "connect_timeout", 2.0, float, 0, low_included=False),
            read_timeout=_url_number(params, "read_timeout", 5.0, float, 0, low_included=False),
            retry=RetryPolicy(attempts=_url_number(params, "attempts", 5, int, 1)),
            partition_cache_ttl=_url_number(params, "partition_cache_ttl", directory.DEFAULT_TTL, float, 0),
        )

    # -- plumbing ----------------------------------------------------------
    async def client(self) -> Any:
        """The process's one aiobotocore client (created on first use)."""
        if self._closed:
            raise BackendUnavailable(f"dynamodb backend for table {self.table} is closed")
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    context = aioboto3.Session().client(
                        "dynamodb", region_name=self.region, endpoint_url=self.endpoint_url, config=self._config
                    )
                    self._client = await context.__aenter__()
                    self._client_context = context
        return self._client

    async def close(self) -> None:
        self._closed = True
        context, self._client_context, self._client = self._client_context, None, None
        if context is not None:
            await context.__aexit__(None, None, None)

    async def create_table(self) -> bool:
        """Create the table if missing (PAY_PER_REQUEST, TTL enabled)."""
        return await create_table(await self.client(), self.table)

    async def _query(self, request: dict[str, Any]) -> dict[str, Any]:
        client = await self.client()
        return await with_retries(
            self.retry, lambda _: client.query(TableName=self.table, **request), what="Query", write=False
        )

    # -- KV core -----------------------------------------------------------
    async def get(self, key: str) -> Item | None:
        _, key_attrs = self.codec.key_attributes(key)
        client = await self.client()
        response = await with_retries(
            self.retry,
            lambda _: client.get_item(TableName=self.table, Key=key_attrs, ConsistentRead=True),
            what="GetItem",
            write=False,
            key=key,
        )
        attrs = response.get("Item")
        return item_from(attrs) if attrs else None

    async def put(self, key: str, value: bytes) -> str:
        result = await self._put(key, value, None)
        assert result.version is not None
        return result.version

    async def delete(self, key: str) -> bool:
        _, key_attrs = self.codec.key_attributes(key)
        client = await self.client()

        async def attempt(after_ambiguous: bool) -> bool:
            response = await client.delete_item(TableName=self.table, Key=key_attrs, ReturnValues="ALL_OLD")
            existed = bool(response.get("Attributes"))
            if after_ambiguous and not existed:
                raise Ambiguous("the key is gone, but an earlier attempt may have removed it")
            return existed

        return await with_retries(self.retry, attempt, what="DeleteItem", write=True, key=key)

    async def list(
        self, prefix: str, start_after: str | None = None, limit: int = 100, max_bytes: int | None = None
    ) -> list[Item]:
        rows = await self._list(prefix, start_after, limit, keys_only=False, max_bytes=max_bytes)
        return [item_from(row) for row in rows]

    async def list_keys(self, prefix: str, start_after: str | None = None, limit: int = 100) -> list[str]:
        rows = await self._list(prefix, start_after, limit, keys_only=True)
        return [key_from(row) for row in rows]

    async def list_versions(
        self, prefix: str, start_after: str | None = None, limit: int = 100
    ) -> list[tuple[str, str]]:
        rows = await self._list(prefix, start_after, limit, keys_only=True, versions=True)
        return [(key_from(row), row.get(VERSION, {}).get("S", "")) for row in rows]

    async def _list(
        self, prefix: str, start_after: str | None, limit: int, *, keys_only: bool, versions: bool = False,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]]:
        if limit <= 0:
            return []

        def partition_rows(partition: str) -> AsyncIterator[dict[str, Any]]:
            return listing.query_partition(
                self._query, partition, prefix, start_after, limit, keys_only=keys_only, versions=versions)

        only = self.codec.layout.partition_of_prefix(prefix)
        if only is not None:
            async with contextlib.aclosing(partition_rows(only)) as rows:
                return await listing.take(rows, limit, max_bytes)
        home = self.codec.layout.home_of_prefix(prefix)
        partitions = listing.directory(self._query, prefix, max(limit, 100), skip=home)
        return await listing.merge_walk(partition_rows(home), partitions, partition_rows, key_from, limit, max_bytes)

    # -- operator tools (bulk.py) -------------------------------------------
    async def export_items(self, start_after: str | None = None, page: int = EXPORT_PAGE) -> AsyncIterator[list[Item]]:
        async for items in bulk.export(self._query, start_after, page):
            yield items

    async def import_items(self, items: Sequence[Item]) -> None:
        puts: list[dict[str, Any]] = []
        partitions: dict[str, None] = {}
        for item in items:
            partition, key_attrs = self.codec.key_attributes(item.key)
            puts.append({**key_attrs, VALUE: {"B": item.value}, VERSION: {"S": item.version}})
            if self._known.needs_row(partition):
                partitions[partition] = None
        # Versions here are random, never counters, so reserving is only
        # bookkeeping for a later export; it is written before the items.
        await self.reserve_versions(item.version for item in items)
        client = await self.client()
        if partitions:  # (an import target is quiesced: no erasure runs meanwhile)
            entries = [bulk.directory_item(p) for p in partitions]
            sent = self._known.now()
            await bulk.batch_put(client, self.table, entries, self.retry, self._bulk_gate)
            self._known.remember(partitions, sent)
        await bulk.batch_put(client, self.table, puts, self.retry, self._bulk_gate)

    async def reserve_versions(self, tokens: Iterable[str]) -> None:
        wanted = highest_per_family(tokens)
        if not wanted:  # random tokens only: nothing to remember
            return
        async with self._watermarks_lock:
            await self._reserve(wanted)

    async def _reserve(self, wanted: dict[str, tuple[int, str]]) -> None:
        client = await self.client()
        if self._watermarks is None:
            self._watermarks = highest_per_family(await bulk.read_watermarks(client, self.table, self.retry))
        known = self._watermarks
        if all(family in known and known[family][0] >= counter for family, (counter, _) in wanted.items()):
            return
        stored = await bulk.write_watermarks(client, self.table, [t for _, t in wanted.values()], self.retry)
        self._watermarks = highest_per_family(stored)

    async def version_watermarks(self) -> list[str]:
        return await bulk.read_watermarks(await self.client(), self.table, self.retry)

    # -- CAS group -----------------------------------------------------------
    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        return await self._put(key, value, Condition.of_absent())

    async def put_if_version(self, key: str, value: bytes, expected: str) -> CasResult:
        return await self._put(key, value, Condition.of_version(expected))

    async def delete_if_version(self, key: str, expected: str) -> CasResult:
        _, key_attrs = self.codec.key_attributes(key)
        request = Condition.of_version(expected).apply({
            "TableName": self.table, "Key": key_attrs, "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        })
        client = await self.client()

        async def attempt(after_ambiguous: bool) -> CasResult:
            try:
                await client.delete_item(**request)
            except ClientError as exc:
                if error_code(exc) != "ConditionalCheckFailedException":
                    raise
                if after_ambiguous:
                    raise Ambiguous("the condition no longer holds; an earlier attempt may have applied") from exc
                current = _failure_item(exc.response.get("Item"))
                return CasResult(False, current.version if current else None, current)
            return CasResult(True, None)

        return await with_retries(self.retry, attempt, what="DeleteItem", write=True, key=key)

    async def _put(self, key: str, value: bytes, condition: Condition | None) -> CasResult:
        partition, key_attrs = self.codec.key_attributes(key)
        version = new_version()
        request: dict[str, Any] = {
            "TableName": self.table,
            "Item": {**key_attrs, VALUE: {"B": value}, VERSION: {"S": version}},
        }
        if condition is not None:
            condition.apply(request)
            request["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
        may_create = condition is None or condition.may_create
        known_until = self._known.valid_until(partition) if may_create else float("inf")
        token = random_hex(16)
        client = await self.client()

        async def attempt(after_ambiguous: bool) -> CasResult:
            # decided per attempt, right before sending: a slow call never relies on an expired entry
            with_directory = self._known.expired(known_until)
            sent = self._known.now()
            try:
                if with_directory:
                    await client.transact_write_items(
                        TransactItems=[{"Put": request}, directory_put(self.table, partition)],
                        ClientRequestToken=token,
                    )
                else:
                    await client.put_item(**request)
            except ClientError as exc:
                failed, attrs = _condition_failure(exc, 0)
                if not failed:
                    raise
                current = _failure_item(attrs)
                if current is not None and current.version == version:
                    return CasResult(True, version)  # an earlier attempt of this call landed
                if after_ambiguous:
                    raise Ambiguous("the condition no longer holds; an earlier attempt may have applied") from exc
                return CasResult(False, current.version if current else None, current)
            if with_directory:
                self._known.remember([partition], sent)
            return CasResult(True, version)

        return await with_retries(self.retry, attempt, what="PutItem", write=True, key=key)

    # -- transactions ------------------------------------------------------
    async def transact(
        self, checks: Sequence[Check] = (), writes: Sequence[Write] = (), count: CountKeys | None = None
    ) -> TxnResult:
        if count is None:
            return await self._transact(checks, writes)
        # TransactWriteItems returns no data, so the count is a keys-only query
        # sent alongside (one round trip of latency, two requests), corrected
        # for the transaction's own writes whichever side of them it read.
        deletes = sum(1 for w in writes if isinstance(w, Delete) and w.key.startswith(count.prefix))
        counting = asyncio.ensure_future(self.list_keys(count.prefix, None, count.limit + deletes))
        try:
            result = await self._transact(checks, writes)
        except BaseException:
            counting.cancel()
            raise
        if not result.applied:
            counting.cancel()
            return result
        try:
            keys = set(await counting)
        except Exception:  # the write applied: never report it failed over a count
            return result  # count None: the caller counts, or does without
        for w in writes:
            if w.key.startswith(count.prefix):
                if isinstance(w, Put):
                    keys.add(w.key)
                else:
                    keys.discard(w.key)
        return dataclasses.replace(result, count=min(len(keys), count.limit))

    async def _transact(self, checks: Sequence[Check], writes: Sequence[Write]) -> TxnResult:
        validate_transaction(checks, writes)
        entries: list[dict[str, Any] | None] = []  # per operation; None: a check with no condition
        versions: list[str | None] = []
        new_partitions: list[str] = []
        trusted: dict[str, float] = {}  # partitions written on the strength of a remembered entry
        for check in checks:
            _, key_attrs = self.codec.key_attributes(check.key)
            condition = Condition.of(check.expect)
            entries.append(
                {"ConditionCheck": condition.apply({
                    "TableName": self.table, "Key": key_attrs, "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                })}
                if condition.clauses else None
            )
        for write in writes:
            partition, key_attrs = self.codec.key_attributes(write.key)
            condition = Condition.of(write.expect)
            if isinstance(write, Put):
                version = write.version or new_version()
                body = {"TableName": self.table, "Item": {**key_attrs, VALUE: {"B": write.value}, VERSION: {"S": version}}}
                if condition.clauses:
                    body["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
                entries.append({"Put": condition.apply(body)})
                versions.append(version)
                if condition.may_create and partition not in new_partitions:
                    until = self._known.valid_until(partition)
                    if until == 0.0:
                        new_partitions.append(partition)
                    else:
                        trusted[partition] = until
            else:
                assert isinstance(write, Delete)
                body = {"TableName": self.table, "Key": key_attrs}
                if condition.clauses:
                    body["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
                entries.append({"Delete": condition.apply(body)})
                versions.append(None)
        operations = [(i, e) for i, e in enumerate(entries) if e is not None]
        if not any(e for _, e in operations if "ConditionCheck" not in e):
            return await self._checks_only(operations, versions)
        items = [e for _, e in operations]
        size = transaction_bytes(items)
        if size > MAX_TXN_BYTES:  # DynamoDB would refuse it as a ValidationException
            raise InvalidTransaction(
                f"transaction is {size} bytes as DynamoDB counts items (limit {MAX_TXN_BYTES})",
                limit=MAX_TXN_BYTES, size=size)
        directory_entries = [directory_put(self.table, p) for p in new_partitions]
        with_entries = size + transaction_bytes(directory_entries)
        if len(items) + len(directory_entries) > MAX_TRANSACT_ITEMS or with_entries > MAX_TXN_BYTES:
            # too big to carry the directory entries too: they go out first
            await self._write_directory(new_partitions)
            new_partitions, directory_entries = [], []
        items += directory_entries
        token = random_hex(16)
        client = await self.client()

        async def attempt(after_ambiguous: bool) -> TxnResult:
            expired = [p for p, until in trusted.items() if self._known.expired(until)]
            if expired:  # a slow call: the entries it relied on expired, write them first
                await self._write_directory(expired)
                for p in expired:
                    del trusted[p]
            sent = self._known.now()
            try:
                await client.transact_write_items(TransactItems=items, ClientRequestToken=token)
            except ClientError as exc:
                reasons = exc.response.get("CancellationReasons") or []
                failed = tuple(
                    op_index for n, (op_index, _) in enumerate(operations)
                    if n < len(reasons) and reasons[n].get("Code") == _CONDITION_FAILED
                )
                if error_code(exc) != "TransactionCanceledException" or not failed:
                    raise
                if _landed(reasons, operations, versions, len(checks)):
                    return TxnResult(True, tuple(versions))
                if after_ambiguous:
                    raise Ambiguous("a condition no longer holds; an earlier attempt may have applied") from exc
                return TxnResult(False, failed=failed, found=_found(reasons, operations))
            self._known.remember(new_partitions, sent)
            return TxnResult(True, tuple(versions))

        return await with_retries(self.retry, attempt, what="TransactWriteItems", write=True, items=items)

    async def _checks_only(self, operations: list[tuple[int, dict[str, Any]]], versions: list[str | None]) -> TxnResult:
        """A transaction that writes nothing: its checks, still atomically."""
        if not operations:
            return TxnResult(True, tuple(versions))
        client = await self.client()
        items = [e for _, e in operations]

        async def attempt(_: bool) -> TxnResult:
            try:
                await client.transact_write_items(TransactItems=items)
            except ClientError as exc:
                failed, _ = _condition_failure(exc, None)
                if not failed:
                    raise
                reasons = exc.response.get("CancellationReasons") or []
                found = _found(reasons, operations)
                return TxnResult(False, failed=tuple(found), found=found)
            return TxnResult(True, tuple(versions))

        return await with_retries(self.retry, attempt, what="TransactWriteItems", write=False, items=items)

    async def _write_directory(self, partitions: Sequence[str]) -> None:
        """Directory entries ahead of a transaction too large to carry them."""
        client = await self.client()
        sent = self._known.now()
        for start in range(0, len(partitions), MAX_TRANSACT_ITEMS):
            chunk = [directory_put(self.table, p) for p in partitions[start:start + MAX_TRANSACT_ITEMS]]
            await with_retries(
                self.retry, lambda _: client.transact_write_items(TransactItems=chunk),
                what="TransactWriteItems", write=True,
            )
        self._known.remember(partitions, sent)

    # -- erasure: the partition directory (directory.py) ----------------------
    @property
    def partition_settle_seconds(self) -> float:  # type: ignore[override]
        """Every replica's memory of a removed entry expires within the TTL,
        and a write sent just before that lands within one attempt's time."""
        return self._known.ttl + self._in_flight

    async def partitions_under(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> list[str]:
        return await directory.names_under(self._query, prefix, start_after, limit)

    async def forget_partitions(self, names: Sequence[str]) -> None:
        self._known.forget(names)
        client = await self.client()

        async def delete(name: str) -> None:
            await with_retries(  # a blind delete: sending it twice is harmless
                self.retry, lambda _: client.delete_item(TableName=self.table, Key=directory.row_key(name)),
                what="DeleteItem", write=False,
            )

        await directory.each(names, delete)

    async def settle_partitions(self, names: Sequence[str]) -> int:
        occupied = await directory.occupied(self._query, names)
        client = await self.client()

        async def put_back(name: str) -> None:  # a write raced the erasure: list its partition again
            await with_retries(
                self.retry, lambda _: client.put_item(TableName=self.table, Item=directory.row_key(name)),
                what="PutItem", write=False,
            )

        await directory.each(occupied, put_back)
        return len(occupied)


def _found(reasons: list[dict[str, Any]], operations: list[tuple[int, dict[str, Any]]]) -> dict[int, Item | None]:
    """For each operation whose condition failed, the item that failed it
    (ALL_OLD comes back with the cancellation: the same atomic step)."""
    return {
        op_index: _failure_item(reasons[n].get("Item"))
        for n, (op_index, _) in enumerate(operations)
        if n < len(reasons) and reasons[n].get("Code") == _CONDITION_FAILED
    }


def _failure_item(attrs: dict[str, Any] | None) -> Item | None:
    return item_from(attrs) if attrs else None


def _condition_failure(exc: ClientError, index: int | None) -> tuple[bool, dict[str, Any] | None]:
    """Whether `exc` is a failed condition (of transaction entry `index`, or of
    any entry when None), and the current item DynamoDB returned with it."""
    code = error_code(exc)
    if code == "ConditionalCheckFailedException":
        return True, exc.response.get("Item")
    if code == "TransactionCanceledException":
        reasons = exc.response.get("CancellationReasons") or []
        if index is None:
            return any(r.get("Code") == _CONDITION_FAILED for r in reasons), None
        if index < len(reasons) and reasons[index].get("Code") == _CONDITION_FAILED:
            return True, reasons[index].get("Item")
    return False, None


def _landed(
    reasons: list[dict[str, Any]],
    operations: list[tuple[int, dict[str, Any]]],
    versions: list[str | None],
    check_count: int,
) -> bool:
    """A conditional put of this transaction already holds this call's version:
    an earlier attempt of the same call was applied."""
    for n, (op_index, _) in enumerate(operations):
        if op_index < check_count or n >= len(reasons):
            continue
        mine = versions[op_index - check_count]
        current = reasons[n].get("Item")
        if mine is not None and current and current.get(VERSION, {}).get("S") == mine:
            return True
    return False


def _url_number(params: dict[str, str], name: str, default: Any, kind: Callable[[str], Any], low: float,
                *, low_included: bool = True) -> Any:
    """A number of the URL, refused when the client could not use it: a
    negative or nan timeout was accepted and then failed every call."""
    text = params.get(name)
    if text is None:
        return default
    bound = f">= {low}" if low_included else f"> {low}"
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < low or (value == low and not low_included):
        raise ValueError(f"dynamodb URL parameter {name}={text!r}: expected a finite number {bound}")
    return value
