"""AIP-155 request ids: a retried mutation with the same id is applied once.

The request's marker is written in the same transaction as the mutation, so
the two land together or not at all: one round trip, no read first. The
marker records the request's fingerprint and the versions its writes got, so
a retry reports the first outcome exactly. Markers
live in hourly buckets (`#/req/{hour}/{tenant}/{id hash}`); a request is
checked against the current and the previous bucket, so the dedupe window is
at least one hour, and buckets older than that are swept by listing a prefix
(no backend TTL support needed). A request id shaped as a lowercase UUIDv7
(what the SDKs send) names its marker itself instead of its hash: its leading
48 bits are a time, so the markers written together sit together in key
order (a hash puts each on a random page of the store's index). Either way
the key is a pure function of the id, so every attempt of a request finds
the same marker.

Where the backend can (`Storage.keeps_markers_with_items`: the embedded
backends), the marker of a single-key write is kept with the item it wrote
rather than as an item of its own at that key; the backend moves it out to its
key when the item is next overwritten or deleted, so a retry finds it either
way; the sweep clears an expired marker kept with an item from its row
(`Storage.forget_markers_before`) and deletes the expired ones of their own.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence

from fencepost import reasons
from fencepost.ids import UUID7

from ..storage import MAX_TXN_OPS, Check, Delete, Marker, Put, Storage, TxnResult, Write, random_hex
from .errors import InvalidArgument
from .keys import GLOBAL_PREFIX, tenant_keys

BUCKET_SECONDS = 3600
_PREFIX = GLOBAL_PREFIX + "req/"
_SEP = b"\n"  # fingerprint (32 bytes) + SEP + JSON {"v": versions written, "f": failed compares}




def _plain(text: str) -> bool:
    """JSON writes `text` as it is between quotes (nothing to escape)."""
    return text.isascii() and text.replace("-", "").replace(".", "").replace("_", "").isalnum() or not text


def _outcome_json(versions: Sequence[str | None], failed: Sequence[int], note: str = "") -> bytes:
    """`json.dumps({"v": versions, "f": failed[, "n": note]})`, byte for byte,
    without the encoder's per-call set-up for the common case (versions and
    note of letters, digits and `-._`, ASCII); anything else goes through json."""
    if len(versions) == 1 and not failed and not note and (only := versions[0]) and only.isascii() and only.isalnum():
        return f'{{"v": ["{only}"], "f": []}}'.encode()  # a single-key write, the most common
    if _plain(note) and all(v is None or (v.isascii() and v.isalnum()) for v in versions):
        v = ", ".join("null" if v is None else f'"{v}"' for v in versions)
        n = f', "n": "{note}"' if note else ""
        return f'{{"v": [{v}], "f": [{", ".join(str(int(i)) for i in failed)}]{n}}}'.encode()
    outcome: dict[str, object] = {"v": list(versions), "f": list(failed)}
    if note:
        outcome["n"] = note
    return json.dumps(outcome).encode()


#: AIP-155 request ids: at most this many characters, on every service
MAX_REQUEST_ID_CHARS = 128


def check_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidArgument(
            reasons.FIELD_INVALID,
            f"request_id is {len(request_id)} characters, over the limit of {MAX_REQUEST_ID_CHARS}",
            {"limit": MAX_REQUEST_ID_CHARS, "size": len(request_id)}, field="request_id",
        )


class RequestLog:
    def __init__(self, storage: Storage, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.clock = clock

    def _marker(self, bucket: int, tenant: str, request_id: str) -> str:
        return self._markers(bucket, tenant, request_id)[0]

    def _markers(self, bucket: int, tenant: str, request_id: str) -> tuple[str, str]:
        """The request's marker keys in window `bucket` and the one before."""
        name = request_id if UUID7.fullmatch(request_id) else hashlib.sha256(request_id.encode()).hexdigest()
        segment = tenant_keys(tenant).root  # the encoded tenant + "/", built once per tenant
        return f"{_PREFIX}{bucket:010d}/{segment}{name}", f"{_PREFIX}{bucket - 1:010d}/{segment}{name}"

    async def transact(
        self,
        tenant: str,
        request_id: str,
        fingerprint: bytes,
        checks: Sequence[Check],
        writes: Sequence[Write],
        failed: Sequence[int] = (),
        note: str = "",
        *,
        item: str | None = None,
        also: Sequence[bytes] = (),
    ) -> TxnResult:
        """Run the transaction once per request id. A retry of an applied
        request returns the first outcome (`replayed = True`, the versions the
        first attempt wrote, and the `failed` it was applied with — a Txn's
        failure branch records its failed compares); otherwise the
        transaction's result (marker excluded). `note` is recorded with the
        marker and handed back on a replay (e.g. the id the first attempt minted).

        `item`: the key every attempt of this request writes (a single-key
        write); the backend may then keep the marker with that item instead
        of as an item of its own (see `Marker`). `also`: other fingerprints a
        first attempt of the same request may have recorded (an earlier
        build's form of it), matched as the same request on a replay."""
        if not request_id:
            return await self.storage.transact(checks, writes)
        check_request_id(request_id)
        # The versions are chosen here so the marker can record them in the same
        # transaction: a replay reports what the first attempt wrote.
        writes = [Put(w.key, w.value, w.expect, w.version or "r" + random_hex()) if isinstance(w, Put) else w
                  for w in writes]
        versions = [w.version if isinstance(w, Put) else None for w in writes]
        bucket = int(self.clock()) // BUCKET_SECONDS
        value = fingerprint + _SEP + _outcome_json(versions, failed, note)
        marker = Marker(*self._markers(bucket, tenant, request_id), value, item)
        result = await self.storage.transact_marked(checks, writes, marker)
        if result.applied:
            return TxnResult(True, result.versions)
        if result.marker is None:
            return TxnResult(False, failed=result.failed, found=result.found)
        # rpartition: the JSON never holds a raw newline, a binary fingerprint may
        first_fp, _, first = result.marker.rpartition(_SEP)
        if first_fp != fingerprint and first_fp not in also:
            raise InvalidArgument(
                reasons.REQUEST_ID_REUSED,
                "request_id was already used for a different request",
                {"request_id": request_id}, field="request_id",
            )
        outcome = json.loads(first)
        return TxnResult(True, tuple(outcome["v"]), tuple(outcome["f"]), replayed=True, note=outcome.get("n", ""))

    async def sweep(self, batch: int = 500) -> int:
        """Delete markers older than the dedupe window, items of their own and
        those kept with an item alike; returns how many."""
        oldest_kept = int(self.clock()) // BUCKET_SECONDS - 1
        removed = 0
        while True:
            keys = await self.storage.list_keys(_PREFIX, None, batch)
            stale = [k for k in keys if int(k[len(_PREFIX):].split("/", 1)[0]) < oldest_kept]
            for i in range(0, len(stale), MAX_TXN_OPS):  # one backend call per batch, not per marker
                await self.storage.transact((), [Delete(k) for k in stale[i:i + MAX_TXN_OPS]])
            removed += len(stale)
            if len(stale) < len(keys) or not keys:
                break
        bound = f"{_PREFIX}{oldest_kept:010d}/"  # the buckets sort by their zero-padded hour
        while (forgotten := await self.storage.forget_markers_before(bound, batch)) > 0:
            removed += forgotten
            if forgotten < batch:
                break
        await self._forget_hours_before(oldest_kept, batch)
        return removed

    async def _forget_hours_before(self, oldest_kept: int, batch: int) -> None:
        """Drop the backend's records of the swept hours (DynamoDB's partition
        directory keeps one per hour and tenant): every later listing of the
        markers would walk each emptied hour again, for ever. No marker is
        written to an hour past the window any more, so nothing races the
        forget; the settle lists again any hour still holding a marker."""
        after: str | None = None
        while names := await self.storage.partitions_under(_PREFIX, after, batch):
            old = [n for n in names if (hour := n[len(_PREFIX):].split("/", 1)[0]).isdigit()
                   and int(hour) < oldest_kept]
            if old:
                await self.storage.forget_partitions(old)
                await self.storage.settle_partitions(old)
            if len(old) < len(names):  # the hours sort by their zero-padded number: the rest are kept
                return
            after = names[-1]
