"""KvService: decode, call the domain, encode."""

from __future__ import annotations

import grpc

from fencepost import reasons
from fencepost.v1 import kv_pb2, kv_pb2_grpc

from ..domain.errors import InvalidArgument
from ..domain.kv import Compare, KvStore
from ..storage import Delete, Expect, Put, Write
from .base import Authenticator, RpcObserver, ServicerBase, caller, unary


def _expect(c: kv_pb2.Compare, i: int) -> Expect:
    which = c.WhichOneof("target")
    if which == "exists":
        return Expect(exists=c.exists)
    if which == "version":
        return Expect(version=c.version)
    if which == "value":
        return Expect(value=c.value)
    # Holding it as "always true" would apply the success branch on a
    # condition nobody checked (a newer client's target arrives here as an
    # unknown field, i.e. as no target at all).
    raise InvalidArgument(reasons.FIELD_INVALID, f"compares[{i}] sets no target (exists, version or value)",
                          field=f"compares[{i}]")


def _writes(ops: list[kv_pb2.TxnOp], field: str) -> list[Write]:
    out: list[Write] = []
    for i, op in enumerate(ops):
        which = op.WhichOneof("op")
        if which == "put":
            out.append(Put(op.put.key, op.put.value))
        elif which == "delete_key":
            out.append(Delete(op.delete_key))
        else:
            # Skipping it would apply less than was asked (an op of a newer
            # client, say), shift `versions` against the ops, and let any
            # number of empty ops past the 100-operation limit.
            raise InvalidArgument(reasons.FIELD_INVALID, f"{field}[{i}] sets no write (put or delete_key)",
                                  field=f"{field}[{i}]")
    return out


class KvServicer(ServicerBase, kv_pb2_grpc.KvServiceServicer):
    def __init__(self, kv: KvStore, auth: Authenticator, observer: RpcObserver | None = None) -> None:
        super().__init__(auth, observer)
        self.kv = kv

    @unary
    async def Put(self, request: kv_pb2.PutRequest, context: grpc.aio.ServicerContext) -> kv_pb2.PutResponse:
        version = await self.kv.put(caller().tenant, request.key, request.value, request.request_id)
        return kv_pb2.PutResponse(version=version)

    @unary
    async def Get(self, request: kv_pb2.GetRequest, context: grpc.aio.ServicerContext) -> kv_pb2.GetResponse:
        item = await self.kv.get(caller().tenant, request.key)
        if item is None:
            return kv_pb2.GetResponse(found=False)
        return kv_pb2.GetResponse(found=True, value=item.value, version=item.version)

    @unary
    async def Delete(self, request: kv_pb2.DeleteRequest, context: grpc.aio.ServicerContext) -> kv_pb2.DeleteResponse:
        existed = await self.kv.delete(caller().tenant, request.key, request.request_id)
        return kv_pb2.DeleteResponse(existed=existed)

    @unary
    async def List(self, request: kv_pb2.ListRequest, context: grpc.aio.ServicerContext) -> kv_pb2.ListResponse:
        page = await self.kv.list(caller().tenant, request.prefix, request.page_size, request.page_token)
        entries = [kv_pb2.KeyValue(key=i.key, value=i.value, version=i.version) for i in page.items]
        return kv_pb2.ListResponse(entries=entries, next_page_token=page.next_page_token)

    @unary
    async def GetWithVersion(
        self, request: kv_pb2.GetWithVersionRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.GetWithVersionResponse:
        item = await self.kv.get(caller().tenant, request.key)
        if item is None:
            return kv_pb2.GetWithVersionResponse(found=False)
        return kv_pb2.GetWithVersionResponse(found=True, value=item.value, version=item.version)

    @unary
    async def PutIfAbsent(
        self, request: kv_pb2.PutIfAbsentRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.PutIfAbsentResponse:
        out = await self.kv.put_if_absent(caller().tenant, request.key, request.value, request.request_id)
        return kv_pb2.PutIfAbsentResponse(applied=out.applied, version=out.version)

    @unary
    async def PutIfVersion(
        self, request: kv_pb2.PutIfVersionRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.PutIfVersionResponse:
        out = await self.kv.put_if_version(
            caller().tenant, request.key, request.value, request.expected_version, request.request_id
        )
        return kv_pb2.PutIfVersionResponse(applied=out.applied, version=out.version)

    @unary
    async def DeleteIfVersion(
        self, request: kv_pb2.DeleteIfVersionRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.DeleteIfVersionResponse:
        out = await self.kv.delete_if_version(
            caller().tenant, request.key, request.expected_version, request.request_id
        )
        return kv_pb2.DeleteIfVersionResponse(applied=out.applied, version=out.version)

    @unary
    async def ListKeys(
        self, request: kv_pb2.ListKeysRequest, context: grpc.aio.ServicerContext
    ) -> kv_pb2.ListKeysResponse:
        page = await self.kv.list(caller().tenant, request.prefix, request.page_size, request.page_token, values=False)
        return kv_pb2.ListKeysResponse(keys=[i.key for i in page.items], next_page_token=page.next_page_token)

    @unary
    async def Txn(self, request: kv_pb2.TxnRequest, context: grpc.aio.ServicerContext) -> kv_pb2.TxnResponse:
        compares = [Compare(c.key, _expect(c, i)) for i, c in enumerate(request.compares)]
        out = await self.kv.txn(
            caller().tenant, compares, _writes(list(request.success_ops), "success_ops"),
            _writes(list(request.failure_ops), "failure_ops"),
            request.request_id,
        )
        return kv_pb2.TxnResponse(
            succeeded=out.succeeded, versions=list(out.versions), failed_compares=list(out.failed_compares)
        )
