"""The SDK's error translation of what arrives on the wire, without a server."""

from __future__ import annotations

import grpc

from fencepost import errors
from fencepost._call import translate


def test_a_details_trailer_that_does_not_decode_keeps_the_calls_code_and_message() -> None:
    """A grpc-status-details-bin that is not a google.rpc.Status (a proxy's,
    a broken server's) raised protobuf's DecodeError out of the call: not a
    FencepostError, and an UNAVAILABLE that was never retried."""
    trailer = grpc.aio.Metadata(("grpc-status-details-bin", b"\xff\xff\xff"))
    exc = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), trailer, details="upstream reset")
    err = translate(exc)
    assert type(err) is errors.Unavailable
    assert (err.code, err.reason, err.message) == ("UNAVAILABLE", "", "upstream reset")
    assert err.__cause__ is exc
