"""Text the Python SDK cannot put on the wire: a str holding a surrogate code
point (what `"\\udc80"` or bytes decoded with "surrogateescape" give). protobuf
refuses to encode it while the request is built; the SDK reports that as its
typed error for the field, as the server would for text that is not UTF-8,
and sends nothing. No server is needed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

import fencepost
from fencepost import errors, reasons
from fencepost._text import refuse_unencodable
from fencepost.v1 import kv_pb2

BAD = "a\udc80"


class _Recorder:
    """Stands in for the client's Caller: records each request it is handed."""

    timeout = None

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def call(self, method: Any, request: Any, **_: Any) -> Any:
        self.sent.append(request)
        raise errors.Unavailable("offline")

    async def stream(self, method: Any, request: Any, **_: Any) -> AsyncIterator[Any]:
        self.sent.append(request)
        raise errors.Unavailable("offline")
        yield  # pragma: no cover  (makes this an async generator)


@pytest.fixture
async def offline() -> AsyncIterator[tuple[fencepost.AsyncClient, _Recorder]]:
    fp = fencepost.AsyncClient(channel=grpc.aio.insecure_channel("127.0.0.1:1"), token="")
    recorder = _Recorder()
    fp._caller = recorder
    try:
        yield fp, recorder
    finally:
        await fp.close()


async def _drain(items: AsyncIterator[Any]) -> None:
    async for _ in items:
        pass


Call = Callable[[fencepost.AsyncClient], Awaitable[Any]]

# (call, the field named, the class raised) for a key, a prefix, and one other field per service
CASES: list[tuple[str, Call, str, type[errors.FencepostError]]] = [
    ("put", lambda fp: fp.put(BAD, b"v"), "key", errors.KeyInvalid),
    ("get", lambda fp: fp.get(BAD), "key", errors.KeyInvalid),
    ("get_with_version", lambda fp: fp.get_with_version(BAD), "key", errors.KeyInvalid),
    ("delete", lambda fp: fp.delete(BAD), "key", errors.KeyInvalid),
    ("put_if_absent", lambda fp: fp.put_if_absent(BAD, b"v"), "key", errors.KeyInvalid),
    ("put_if_version", lambda fp: fp.put_if_version(BAD, b"v", "1"), "key", errors.KeyInvalid),
    ("delete_if_version", lambda fp: fp.delete_if_version(BAD, "1"), "key", errors.KeyInvalid),
    ("list_page", lambda fp: fp.list_page(BAD), "prefix", errors.KeyInvalid),
    ("list", lambda fp: _drain(fp.list(BAD)), "prefix", errors.KeyInvalid),
    ("list_keys", lambda fp: _drain(fp.list_keys(BAD)), "prefix", errors.KeyInvalid),
    ("put request_id", lambda fp: fp.put("k", b"v", request_id=BAD), "request_id", errors.FieldInvalid),
    ("expected_version", lambda fp: fp.put_if_version("k", b"v", BAD), "expected_version", errors.FieldInvalid),
    ("page_token", lambda fp: fp.list_page("p", page_token=BAD), "page_token", errors.FieldInvalid),
    ("open_session agent", lambda fp: fp.open_session(BAD, "s"), "agent", errors.FieldInvalid),
    ("open_session key", lambda fp: fp.open_session("agent", BAD), "session_key", errors.FieldInvalid),
    ("open_session metadata", lambda fp: fp.open_session("agent", "s", metadata={"m": BAD}),
     "metadata.m", errors.FieldInvalid),
    ("acquire_lease", lambda fp: fp.acquire_lease("sid", BAD), "holder_id", errors.FieldInvalid),
    ("commit consume", lambda fp: fp.commit("sid", 1, 0, consume=["ok", BAD]), "consume[1]", errors.FieldInvalid),
    ("read_log", lambda fp: _drain(fp.read_log(BAD)), "session_id", errors.FieldInvalid),
    ("deliver", lambda fp: fp.deliver(b"p", agent="a", session_id=BAD), "session_id", errors.FieldInvalid),
    ("memory_append", lambda fp: fp.memory_append("agent", "c", about=[BAD]), "about[0]", errors.FieldInvalid),
    ("memory_forget", lambda fp: fp.memory_forget("agent", BAD), "entry_id", errors.FieldInvalid),
    ("memory_append metadata", lambda fp: fp.memory_append("agent", "c", metadata={"x": {"y": [BAD]}}),
     "metadata.x.y[0]", errors.FieldInvalid),
    ("put_eval_run", lambda fp: fp.put_eval_run("agent", "run", {"score": BAD}), "snapshot.score", errors.FieldInvalid),
    ("append_turn", lambda fp: fp.append_turn("agent", {"at": "2024-01-01T00:00:00Z", "sessionId": BAD,
                                                          "channelId": "c", "status": "ok"}),
     "record.sessionId", errors.FieldInvalid),
    ("create_reminder", lambda fp: fp.create_reminder("sid", 1, BAD, after_seconds=5), "prompt", errors.FieldInvalid),
    ("erase_agent", lambda fp: fp.erase_agent(BAD), "agent", errors.FieldInvalid),
]


@pytest.mark.parametrize(("call", "field", "cls"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_a_surrogate_is_the_typed_error_for_its_field_and_nothing_is_sent(
    offline: tuple[fencepost.AsyncClient, _Recorder], call: Call, field: str, cls: type[errors.FencepostError],
) -> None:
    fp, recorder = offline
    with pytest.raises(errors.FencepostError) as caught:
        await call(fp)
    err = caught.value
    assert type(err) is cls, repr(err)
    assert err.code == "INVALID_ARGUMENT"
    assert err.reason == (reasons.KEY_INVALID if cls is errors.KeyInvalid else reasons.FIELD_INVALID)
    assert err.message == f"{field} is not valid UTF-8 (it holds a lone surrogate)"
    assert err.field_violations == {field: err.message}
    assert isinstance(err.__cause__, UnicodeEncodeError)
    assert recorder.sent == []


async def test_well_formed_text_goes_through(offline: tuple[fencepost.AsyncClient, _Recorder]) -> None:
    fp, recorder = offline
    with pytest.raises(errors.Unavailable):
        await fp.put("k😀é", b"v", request_id="r")
    assert [r.key for r in recorder.sent] == ["k😀é"]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: fencepost.compare(BAD, exists=True), "key"),
        (lambda: fencepost.put_op(BAD, b"v"), "put.key"),
        (lambda: fencepost.delete_op(BAD), "delete_key"),
        (lambda: fencepost.compare("k", version=BAD), "version"),
    ],
    ids=["compare", "put_op", "delete_op", "compare version"],
)
def test_txn_helpers_refuse_a_surrogate(build: Callable[[], Any], field: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        build()
    assert type(caught.value) is (errors.FieldInvalid if field == "version" else errors.KeyInvalid)
    assert caught.value.field_violations == {field: f"{field} is not valid UTF-8 (it holds a lone surrogate)"}


async def test_leaving_a_wrapped_listing_early_closes_the_method_s_generator_at_once() -> None:
    """The wrapper around async-generator methods closes the one it wraps when
    the caller stops reading (its `finally` runs then, not when the loop's
    finalizer gets to it)."""
    ended: list[str] = []

    async def listing(self: object, prefix: str) -> AsyncIterator[str]:
        try:
            while True:
                yield prefix
        finally:
            ended.append(prefix)

    items = refuse_unencodable(listing)(None, "p")
    assert await items.__anext__() == "p"
    await items.aclose()
    assert ended == ["p"]
    with pytest.raises(errors.FieldInvalid):
        await refuse_unencodable(_encodes)(None, "k", {"a": BAD})
    with pytest.raises(errors.KeyInvalid):
        await refuse_unencodable(_encodes, frozenset({"key"}))(None, BAD, {})


async def _encodes(self: object, key: str, labels: dict[str, str]) -> None:
    kv_pb2.PutRequest(key=key)
    struct_pb2.Struct().update(labels)


def test_the_blocking_client_raises_the_same() -> None:
    with fencepost.Client("127.0.0.1:1", token="", timeout=0.5, retry=fencepost.NO_RETRY) as fp:
        with pytest.raises(errors.KeyInvalid) as caught:
            fp.put(BAD, b"v")
    assert caught.value.field_violations == {"key": "key is not valid UTF-8 (it holds a lone surrogate)"}


#: run with protobuf's pure-Python implementation (PyPy's, or
#: PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python): it refuses a surrogate with
#: a ValueError raised while handling the UnicodeEncodeError, not with the latter
_PURE_PYTHON_PROTOBUF = """
import asyncio
from google.protobuf.internal import api_implementation
import fencepost
from fencepost import errors

assert api_implementation.Type() == "python", api_implementation.Type()
BAD = "a\\udc80"

async def main():
    fp = fencepost.AsyncClient("127.0.0.1:1", token="", timeout=0.5, retry=fencepost.NO_RETRY)
    async def listing():
        async for _ in fp.list(BAD):
            pass
    calls = {
        "put": lambda: fp.put(BAD, b"v"),
        "open_session": lambda: fp.open_session("agent", "s", metadata={"m": BAD}),
        "put_eval_run": lambda: fp.put_eval_run("agent", "run", {"score": BAD}),
        "list": listing,
    }
    try:
        for name, call in calls.items():
            try:
                await call()
            except errors.FencepostError as err:
                print(name, type(err).__name__, sorted(err.field_violations))
            except Exception as exc:
                print(name, "untyped", type(exc).__name__)
    finally:
        await fp.close()

asyncio.run(main())
"""


def test_the_typed_error_does_not_depend_on_protobuf_s_implementation() -> None:
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _PURE_PYTHON_PROTOBUF], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "put KeyInvalid ['key']",
        "open_session FieldInvalid ['metadata.m']",
        "put_eval_run FieldInvalid ['snapshot.score']",
        "list KeyInvalid ['prefix']",
    ], res.stdout


def test_txn_helpers_still_take_what_protobuf_takes() -> None:
    """The surrogate check looks at str only: a UTF-8 bytes key, which
    protobuf takes for a string field, builds the same op as before the
    check (not a TypeError from the check's pattern)."""
    assert fencepost.compare(b"k", exists=True) == kv_pb2.Compare(key="k", exists=True)
    assert fencepost.compare("k", version=b"v1") == kv_pb2.Compare(key="k", version="v1")
    assert fencepost.put_op(b"k", b"v") == kv_pb2.TxnOp(put=kv_pb2.KeyValuePut(key="k", value=b"v"))
    assert fencepost.delete_op(b"k") == kv_pb2.TxnOp(delete_key="k")
