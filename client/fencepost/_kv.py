"""KvService methods of the async client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._call import paged
from ._text import check_text
from .ids import new_request_id
from .v1 import kv_pb2, kv_pb2_grpc


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    version: str


@dataclass(frozen=True, slots=True)
class CasResult:
    applied: bool
    version: str  # new version when applied, else the current one ("" when absent)


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    versions: list[str]
    failed_compares: list[int]


def compare(key: str, *, exists: bool | None = None, version: str | None = None, value: bytes | None = None) -> kv_pb2.Compare:
    """Build a Txn compare (give exactly one of exists / version / value)."""
    given = sum(target is not None for target in (exists, version, value))
    if given > 1:  # a compare has one target: the others would be dropped, checking less than asked
        raise ValueError("compare takes exactly one of exists / version / value")
    # built before any client call: text protobuf cannot encode is the client methods' typed error here too
    check_text("key", key, key=True)
    if exists is not None:
        return kv_pb2.Compare(key=key, exists=exists)
    if version is not None:
        check_text("version", version)
        return kv_pb2.Compare(key=key, version=version)
    if value is not None:
        return kv_pb2.Compare(key=key, value=value)
    raise ValueError("compare needs one of exists / version / value")


def put_op(key: str, value: bytes) -> kv_pb2.TxnOp:
    check_text("put.key", key, key=True)
    return kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key=key, value=value))


def delete_op(key: str) -> kv_pb2.TxnOp:
    check_text("delete_key", key, key=True)
    return kv_pb2.TxnOp(delete_key=key)


def _rid(request_id: str | None) -> str:
    """Conditional writes always carry a request id, so a retry after an
    ambiguous failure reports the first outcome instead of `applied = false`."""
    return request_id if request_id is not None else new_request_id()


def _resendable(request_id: str) -> bool:
    """Whether a conditional write may be resent: only with its request id.
    Without one (`request_id=""`) a resend after an applied attempt would
    answer `applied = false` against the caller's own write, or (Txn) apply
    the failure branch after the success branch."""
    return bool(request_id)


class KvMethods:
    """Mixed into AsyncClient; `self._caller` and `self._channel` come from it."""

    _caller: Any
    _kv: kv_pb2_grpc.KvServiceStub

    async def put(self, key: str, value: bytes, *, request_id: str = "", **opts: Any) -> str:
        """Write `value`; returns the new version. An overwrite is naturally
        idempotent, so it is retried without a request id (cheaper); pass one to
        have a retry report the first outcome."""
        req = kv_pb2.PutRequest(key=key, value=value, request_id=request_id)
        return (await self._caller.call(self._kv.Put, req, safe=True, **opts)).version

    async def get(self, key: str, **opts: Any) -> Entry | None:
        """The entry, or None on a miss (an outage raises, never returns None)."""
        res = await self._caller.call(self._kv.Get, kv_pb2.GetRequest(key=key), safe=True, **opts)
        return Entry(key, res.value, res.version) if res.found else None

    async def get_with_version(self, key: str, **opts: Any) -> Entry | None:
        res = await self._caller.call(
            self._kv.GetWithVersion, kv_pb2.GetWithVersionRequest(key=key), safe=True, **opts
        )
        return Entry(key, res.value, res.version) if res.found else None

    async def delete(self, key: str, *, request_id: str = "", **opts: Any) -> bool:
        """Remove `key`; returns whether it existed (after a retried call,
        `False` may mean the first attempt removed it; pass a request id to
        get the first outcome)."""
        req = kv_pb2.DeleteRequest(key=key, request_id=request_id)
        return (await self._caller.call(self._kv.Delete, req, safe=True, **opts)).existed

    async def put_if_absent(self, key: str, value: bytes, *, request_id: str | None = None, **opts: Any) -> CasResult:
        req = kv_pb2.PutIfAbsentRequest(key=key, value=value, request_id=_rid(request_id))
        res = await self._caller.call(self._kv.PutIfAbsent, req, safe=_resendable(req.request_id), **opts)
        return CasResult(res.applied, res.version)

    async def put_if_version(
        self, key: str, value: bytes, expected_version: str, *, request_id: str | None = None, **opts: Any
    ) -> CasResult:
        req = kv_pb2.PutIfVersionRequest(
            key=key, value=value, expected_version=expected_version, request_id=_rid(request_id)
        )
        res = await self._caller.call(self._kv.PutIfVersion, req, safe=_resendable(req.request_id), **opts)
        return CasResult(res.applied, res.version)

    async def delete_if_version(
        self, key: str, expected_version: str, *, request_id: str | None = None, **opts: Any
    ) -> CasResult:
        req = kv_pb2.DeleteIfVersionRequest(key=key, expected_version=expected_version, request_id=_rid(request_id))
        res = await self._caller.call(self._kv.DeleteIfVersion, req, safe=_resendable(req.request_id), **opts)
        return CasResult(res.applied, res.version)

    async def list_page(
        self, prefix: str = "", *, page_size: int = 0, page_token: str = "", **opts: Any
    ) -> tuple[list[Entry], str]:
        """One page of entries under `prefix` and the next page token ("" at the end)."""
        req = kv_pb2.ListRequest(prefix=prefix, page_size=page_size, page_token=page_token)
        res = await self._caller.call(self._kv.List, req, safe=True, **opts)
        return [Entry(e.key, e.value, e.version) for e in res.entries], res.next_page_token

    async def list(self, prefix: str = "", *, page_size: int = 0, **opts: Any) -> AsyncIterator[Entry]:
        """Every entry under `prefix`, in key order, fetched page by page."""
        async for entry in paged(lambda token: self.list_page(
            prefix, page_size=page_size, page_token=token, **opts
        )):
            yield entry

    async def list_keys_page(
        self, prefix: str = "", *, page_size: int = 0, page_token: str = "", **opts: Any
    ) -> tuple[list[str], str]:
        req = kv_pb2.ListKeysRequest(prefix=prefix, page_size=page_size, page_token=page_token)
        res = await self._caller.call(self._kv.ListKeys, req, safe=True, **opts)
        return list(res.keys), res.next_page_token

    async def list_keys(self, prefix: str = "", *, page_size: int = 0, **opts: Any) -> AsyncIterator[str]:
        async for key in paged(lambda token: self.list_keys_page(
            prefix, page_size=page_size, page_token=token, **opts
        )):
            yield key

    async def txn(
        self,
        compares: Sequence[kv_pb2.Compare] = (),
        success: Sequence[kv_pb2.TxnOp] = (),
        failure: Sequence[kv_pb2.TxnOp] = (),
        *,
        request_id: str | None = None,
        **opts: Any,
    ) -> TxnResult:
        """Apply `success` when every compare holds, else `failure`, atomically."""
        req = kv_pb2.TxnRequest(
            compares=list(compares), success_ops=list(success), failure_ops=list(failure),
            request_id=_rid(request_id),
        )
        res = await self._caller.call(self._kv.Txn, req, safe=_resendable(req.request_id), **opts)
        return TxnResult(res.succeeded, list(res.versions), list(res.failed_compares))
