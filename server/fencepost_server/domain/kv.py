"""KvService rules: key scoping, limits, pagination, CAS, Txn and request ids."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from fencepost import reasons

from ..storage import Delete, Expect, Item, Put, Storage, Write, over_budget
from .conditions import Unsatisfiable, plan
from .errors import Aborted, InvalidArgument, limit_error
from .keys import TenantKeys, tenant_keys
from .limits import Limits
from .paging import ENTRY_OVERHEAD, PageTokens, fits, page_size
from .requests import RequestLog

#: the longest version a compare may name: every backend mints ~33 characters
VERSION_MAX_CHARS = 256


@dataclass(frozen=True, slots=True)
class Compare:
    key: str
    expect: Expect


@dataclass(frozen=True, slots=True)
class CasOutcome:
    applied: bool
    version: str  # new version when applied, else current ("" when absent)


@dataclass(frozen=True, slots=True)
class TxnOutcome:
    succeeded: bool
    versions: tuple[str, ...]
    failed_compares: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Page:
    items: list[Item]
    next_page_token: str


def check_key(key: str, limits: Limits, field: str = "key", *, allow_empty: bool = False) -> None:
    if not key and not allow_empty:
        raise InvalidArgument(reasons.KEY_INVALID, f"{field} must not be empty", field=field)
    if "\x00" in key:
        raise InvalidArgument(reasons.KEY_INVALID, f"{field} must not contain NUL", field=field)
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > limits.max_key_bytes:
        raise limit_error(reasons.KEY_TOO_LONG, field, limits.max_key_bytes, size, field=field)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(reasons.KEY_INVALID, f"{field} is not valid UTF-8", field=field) from None


def check_value(value: bytes, limits: Limits, field: str = "value") -> None:
    if len(value) > limits.max_value_bytes:
        raise limit_error(reasons.VALUE_TOO_LARGE, field, limits.max_value_bytes, len(value), field=field)


def _fingerprint(*parts: object) -> bytes:
    """sha256 over each part's repr followed by a NUL (stored in markers: the format must not change)."""
    return hashlib.sha256(("\x00".join(map(repr, parts)) + "\x00").encode()).digest()


class KvStore:
    """The KV rules over one backend. Stateless apart from its configuration."""

    _TXN_ATTEMPTS = 8

    def __init__(
        self, storage: Storage, limits: Limits, requests: RequestLog, pages: PageTokens | None = None,
    ) -> None:
        self.storage = storage
        self.limits = limits
        self.requests = requests
        self.pages = pages or PageTokens.ephemeral()

    # -- reads -------------------------------------------------------------
    async def get(self, tenant: str, key: str) -> Item | None:
        check_key(key, self.limits)
        keys = tenant_keys(tenant)
        item = await self.storage.get(keys.kv(key))
        return Item(key, item.value, item.version) if item else None

    async def list(self, tenant: str, prefix: str, size: int, token: str, *, values: bool = True) -> Page:
        check_key(prefix, self.limits, "prefix", allow_empty=True)
        limit = page_size(self.limits, size)
        # List and ListKeys walk the same positions: a token of one resumes the other.
        listing = ("kv.list", prefix)
        after = await self.pages.resume(tenant, listing, token)
        keys = tenant_keys(tenant)
        scoped_after = keys.kv(after) if after is not None else None
        # One extra row tells whether another page exists without a second call.
        budget = self.limits.max_page_bytes
        if values:
            # read no further than one response holds (cut exactly below)
            rows = await self.storage.list(keys.kv(prefix), scoped_after, limit + 1, max_bytes=budget)
            items = [Item(keys.unscope_kv(r.key), r.value, r.version) for r in rows]
            more = len(items) > limit or over_budget(rows, budget)
        else:
            names = await self.storage.list_keys(keys.kv(prefix), scoped_after, limit + 1)
            items = [Item(keys.unscope_kv(n), b"", "") for n in names]
            more = len(items) > limit
        items = items[:limit]
        # AIP-158 lets a page hold fewer than asked: end it before it outgrows
        # one response (1000 values at the limit are 256 MiB), never before
        # its first entry.
        cut = fits((len(i.key.encode()) + len(i.value) + ENTRY_OVERHEAD for i in items), budget)
        if cut is not None:
            items, more = items[:cut], True
        token_out = await self.pages.issue(tenant, listing, items[-1].key) if more else ""
        return Page(items, token_out)

    # -- writes ------------------------------------------------------------
    async def put(self, tenant: str, key: str, value: bytes, request_id: str = "") -> str:
        check_key(key, self.limits)
        check_value(value, self.limits)
        scoped = tenant_keys(tenant).kv(key)
        if not request_id:
            return await self.storage.put(scoped, value)
        fp = _fingerprint("put", key, hashlib.sha256(value).digest())
        result = await self.requests.transact(tenant, request_id, fp, [], [Put(scoped, value)], item=scoped)
        return result.versions[0] or ""

    async def delete(self, tenant: str, key: str, request_id: str = "") -> bool:
        check_key(key, self.limits)
        scoped = tenant_keys(tenant).kv(key)
        if not request_id:
            return await self.storage.delete(scoped)
        fp = _fingerprint("delete", key)
        # Conditioned on existence so the response can say whether it existed.
        result = await self.requests.transact(tenant, request_id, fp, [], [Delete(scoped, Expect(exists=True))])
        return result.applied

    async def put_if_absent(self, tenant: str, key: str, value: bytes, request_id: str = "") -> CasOutcome:
        check_key(key, self.limits)
        check_value(value, self.limits)
        scoped = tenant_keys(tenant).kv(key)
        if not request_id:
            res = await self.storage.put_if_absent(scoped, value)
            return CasOutcome(res.applied, res.version or "")
        fp = _fingerprint("put_if_absent", key, hashlib.sha256(value).digest())
        return await self._conditional(tenant, request_id, fp, Put(scoped, value, Expect(exists=False)))

    async def put_if_version(
        self, tenant: str, key: str, value: bytes, expected: str, request_id: str = ""
    ) -> CasOutcome:
        check_key(key, self.limits)
        check_value(value, self.limits)
        self._check_version(expected)
        scoped = tenant_keys(tenant).kv(key)
        if not request_id:
            res = await self.storage.put_if_version(scoped, value, expected)
            return CasOutcome(res.applied, res.version or "")
        fp = _fingerprint("put_if_version", key, expected, hashlib.sha256(value).digest())
        return await self._conditional(tenant, request_id, fp, Put(scoped, value, Expect(version=expected)))

    async def delete_if_version(self, tenant: str, key: str, expected: str, request_id: str = "") -> CasOutcome:
        check_key(key, self.limits)
        self._check_version(expected)
        scoped = tenant_keys(tenant).kv(key)
        if not request_id:
            res = await self.storage.delete_if_version(scoped, expected)
            return CasOutcome(res.applied, res.version or "")
        fp = _fingerprint("delete_if_version", key, expected)
        return await self._conditional(tenant, request_id, fp, Delete(scoped, Expect(version=expected)))

    async def txn(
        self,
        tenant: str,
        compares: Sequence[Compare],
        success: Sequence[Write],
        failure: Sequence[Write],
        request_id: str = "",
    ) -> TxnOutcome:
        """etcd-style Txn: when every compare holds apply `success`, else `failure`,
        atomically. The failure branch is applied conditioned on the exact state
        that made the compares fail, so the decision and the writes are atomic."""
        self._check_txn(compares, success, failure, request_id)
        keys = tenant_keys(tenant)
        cmp_scoped = [(keys.kv(c.key), c.expect) for c in compares]
        success_s = [_scope_write(keys, w) for w in success]
        failure_s = [_scope_write(keys, w) for w in failure]
        # the fingerprint reprs every value (up to the 4 MiB limit): only a request id needs it
        fp = _fingerprint("txn", compares, success, failure) if request_id else b""
        for _ in range(self._TXN_ATTEMPTS):
            try:
                checks, writes = plan(cmp_scoped, success_s)
            except Unsatisfiable:
                checks, writes = None, None
            if writes is not None:
                result = await self.requests.transact(tenant, request_id, fp, checks or [], writes)
                if result.applied:  # a replay reports the first outcome, either branch
                    return TxnOutcome(not result.failed, tuple(v or "" for v in result.versions), result.failed)
            # Some compare failed: read the compared keys and decide on that snapshot.
            snapshot = {k: await self.storage.get(k) for k, _ in cmp_scoped}
            failed = tuple(i for i, (k, e) in enumerate(cmp_scoped) if not e.holds(snapshot[k]))
            if not failed:
                continue  # raced with a writer that made the compares hold again
            pins = [
                (k, Expect(version=item.version) if item else Expect(exists=False)) for k, item in snapshot.items()
            ]
            checks, writes = plan(pins, failure_s)
            result = await self.requests.transact(tenant, request_id, fp, checks, writes, failed)
            if result.replayed:
                return TxnOutcome(not result.failed, tuple(v or "" for v in result.versions), result.failed)
            if result.applied:
                return TxnOutcome(False, tuple(v or "" for v in result.versions), failed)
        raise Aborted(
            reasons.TXN_CONTENDED,
            "the compared keys kept changing; retry the transaction",
        )

    # -- helpers -----------------------------------------------------------
    async def _conditional(self, tenant: str, request_id: str, fp: bytes, write: Write) -> CasOutcome:
        # a single-key write: its marker may be kept with the item (no second item)
        result = await self.requests.transact(tenant, request_id, fp, [], [write], item=write.key)
        if result.applied:
            return CasOutcome(True, result.versions[0] or "")
        # The version that refused the write, read by the backend in the same
        # atomic step: a read after the refusal could see a later write (or a
        # delete: "not applied, key absent", which no atomic order allows).
        refused_by = (result.found or {}).get(0)
        return CasOutcome(False, refused_by.version if refused_by else "")

    def _check_version(self, expected: str, field: str = "expected_version") -> None:
        if not expected:
            raise InvalidArgument(
                reasons.VERSION_INVALID,
                f"{field} must not be empty (no key has the empty version; absence is exists = false)",
                field=field,
            )
        if len(expected) > VERSION_MAX_CHARS:
            # no key has one (no backend mints it), and DynamoDB would refuse a
            # huge one inside its condition expression: refused alike everywhere
            raise InvalidArgument(
                reasons.VERSION_INVALID,
                f"{field} is {len(expected)} characters; no key has a version over {VERSION_MAX_CHARS}",
                {"limit": VERSION_MAX_CHARS, "size": len(expected)}, field=field,
            )

    def _check_txn(
        self, compares: Sequence[Compare], success: Sequence[Write], failure: Sequence[Write], request_id: str
    ) -> None:
        # A request id's marker travels in the same backend transaction (a
        # check of the previous window and the marker itself): two operations.
        marker_ops = 2 if request_id else 0
        for i, c in enumerate(compares):
            check_key(c.key, self.limits, f"compares[{i}].key")
            if c.expect.version is not None:
                # empty or over the bound: no key ever has it, the compare could never hold
                self._check_version(c.expect.version, f"compares[{i}].version")
            if c.expect.value is not None:
                # No stored value is larger, so such a compare could never
                # hold; and DynamoDB takes less than the transaction limit in
                # one condition expression. Refused alike on every backend.
                check_value(c.expect.value, self.limits, f"compares[{i}].value")
        for name, branch in (("success_ops", success), ("failure_ops", failure)):
            seen: set[str] = set()
            size = 0
            for i, w in enumerate(branch):
                # named as TxnRequest spells the field (a TxnOp is `put` or `delete_key`)
                op = f"{name}[{i}].put" if isinstance(w, Put) else None
                check_key(w.key, self.limits, f"{op}.key" if op else f"{name}[{i}].delete_key")
                if isinstance(w, Put):
                    check_value(w.value, self.limits, f"{op}.value")
                    size += len(w.value)
                size += len(w.key.encode())
                if w.key in seen:
                    raise InvalidArgument(
                        reasons.TXN_DUPLICATE_KEY, f"{name} names key {w.key!r} twice",
                        {"key": w.key}, field=name,
                    )
                seen.add(w.key)
            ops = len(compares) + len(branch) + marker_ops
            limit = self.limits.max_txn_ops
            if ops > limit:
                with_marker = " (a request_id takes 2 of them)" if marker_ops else ""
                # the compares count in either branch: over by themselves, they are what to shrink
                over = "compares" if len(compares) + marker_ops > limit else name
                raise InvalidArgument(
                    reasons.TXN_TOO_LARGE,
                    f"transaction has {ops} operations{with_marker}, over the limit of {limit}",
                    {"limit": limit, "size": ops}, field=over,
                )
            compared = sum(len(c.key.encode()) + len(c.expect.value or b"") for c in compares)
            size += compared
            if size > self.limits.max_txn_bytes:
                over = "compares" if compared > self.limits.max_txn_bytes else name
                raise limit_error(reasons.TXN_TOO_LARGE, "transaction", self.limits.max_txn_bytes, size, field=over)


def _scope_write(keys: TenantKeys, w: Write) -> Write:
    if isinstance(w, Put):
        return Put(keys.kv(w.key), w.value)
    return Delete(keys.kv(w.key))
