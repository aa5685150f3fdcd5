"""AIP-155 request ids: a retried mutation with the same id is applied once.

The request's marker is written in the same transaction as the mutation, so
the two land together or not at all: one round trip, no read first. The
marker records the request's fingerprint and the versions its writes got, so
a retry reports the first outcome exactly. Markers
live in hourly buckets (`#/req/{hour}/{tenant}/{id hash}`); a request is
checked against the current and the previous bucket, so the dedupe window is
at least one hour, and buckets older than that are swept by listing a prefix
(no backend TTL support needed).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Sequence

from fencepost import reasons
from fencepost.keys import encode_segment

from ..storage import Check, Expect, Put, Storage, TxnResult, Write
from .errors import InvalidArgument
from .keys import GLOBAL_PREFIX

BUCKET_SECONDS = 3600
_PREFIX = GLOBAL_PREFIX + "req/"
_SEP = b"\n"  # fingerprint (32 bytes) + SEP + JSON {"v": versions written, "f": failed compares}


class RequestLog:
    def __init__(self, storage: Storage, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.clock = clock

    def _marker(self, bucket: int, tenant: str, request_id: str) -> str:
        digest = hashlib.sha256(request_id.encode()).hexdigest()
        return f"{_PREFIX}{bucket:010d}/{encode_segment(tenant)}/{digest}"

    async def transact(
        self,
        tenant: str,
        request_id: str,
        fingerprint: bytes,
        checks: Sequence[Check],
        writes: Sequence[Write],
        failed: Sequence[int] = (),
        note: str = "",
    ) -> TxnResult:
        """Run the transaction once per request id. A retry of an applied
        request returns the first outcome (`replayed = True`, the versions the
        first attempt wrote, and the `failed` it was applied with — a Txn's
        failure branch records its failed compares); otherwise the
        transaction's result (marker excluded). `note` is recorded with the
        marker and handed back on a replay (e.g. the id the first attempt minted)."""
        if not request_id:
            return await self.storage.transact(checks, writes)
        if len(request_id) > 128:
            raise InvalidArgument(
                reasons.FIELD_INVALID, "request_id is longer than 128 characters", field="request_id"
            )
        # The versions are chosen here so the marker can record them in the same
        # transaction: a replay reports what the first attempt wrote.
        writes = [Put(w.key, w.value, w.expect, w.version or "r" + uuid.uuid4().hex) if isinstance(w, Put) else w
                  for w in writes]
        versions = [w.version if isinstance(w, Put) else None for w in writes]
        bucket = int(self.clock()) // BUCKET_SECONDS
        current = self._marker(bucket, tenant, request_id)
        previous = self._marker(bucket - 1, tenant, request_id)
        outcome: dict[str, object] = {"v": versions, "f": list(failed)}
        if note:
            outcome["n"] = note
        marker = fingerprint + _SEP + json.dumps(outcome).encode()
        result = await self.storage.transact(
            [*checks, Check(previous, Expect(exists=False))],
            [*writes, Put(current, marker, Expect(exists=False))],
        )
        if result.applied:
            return TxnResult(True, result.versions[:-1])
        marker_indexes = {len(checks), len(checks) + 1 + len(writes)}
        if marker_indexes.isdisjoint(result.failed):
            def caller_index(i: int) -> int:
                return i if i < len(checks) else i - 1

            found = {caller_index(i): item for i, item in (result.found or {}).items() if i not in marker_indexes}
            return TxnResult(False, failed=tuple(caller_index(i) for i in result.failed), found=found)
        for key in (current, previous):
            found = await self.storage.get(key)
            if found is not None:
                # rpartition: the JSON never holds a raw newline, a binary fingerprint may
                first_fp, _, first = found.value.rpartition(_SEP)
                if first_fp != fingerprint:
                    raise InvalidArgument(
                        reasons.REQUEST_ID_REUSED,
                        "request_id was already used for a different request",
                        {"request_id": request_id}, field="request_id",
                    )
                first_outcome = json.loads(first)
                return TxnResult(
                    True, tuple(first_outcome["v"]), tuple(first_outcome["f"]), replayed=True,
                    note=first_outcome.get("n", ""),
                )
        # The marker vanished between the two calls (swept): treat as not seen.
        return await self.transact(tenant, request_id, fingerprint, checks, writes, failed, note)

    async def sweep(self, batch: int = 500) -> int:
        """Delete markers older than the dedupe window; returns how many."""
        oldest_kept = int(self.clock()) // BUCKET_SECONDS - 1
        removed = 0
        while True:
            keys = await self.storage.list_keys(_PREFIX, None, batch)
            stale = [k for k in keys if int(k[len(_PREFIX):].split("/", 1)[0]) < oldest_kept]
            for key in stale:
                await self.storage.delete(key)
            removed += len(stale)
            if len(stale) < len(keys) or not keys:
                return removed
