"""The SDK's error translation of what arrives on the wire, without a server."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from fencepost import errors, reasons
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


def _failed(code: grpc.StatusCode, *infos: error_details_pb2.ErrorInfo) -> grpc.aio.AioRpcError:
    """A failed call whose google.rpc.Status carries `infos` (and the call's message)."""
    details = []
    for info in infos:
        packed = any_pb2.Any()
        packed.Pack(info)
        details.append(packed)
    status = status_pb2.Status(code=code.value[0], message="refused", details=details)
    trailer = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailer, details="refused")


def _info(reason: str, domain: str, **metadata: str) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata)


def test_an_error_info_of_fencepost_s_domain_picks_the_reason_s_class() -> None:
    err = translate(_failed(grpc.StatusCode.FAILED_PRECONDITION, _info("LEASE_FENCED", reasons.DOMAIN, generation="3")))
    assert type(err) is errors.LeaseFenced
    assert (err.reason, err.metadata) == ("LEASE_FENCED", {"generation": "3"})


@pytest.mark.parametrize("domain", ["proxy.example.com", "googleapis.com", ""])
@pytest.mark.parametrize(
    ("code", "reason", "generic"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_FENCED", errors.FailedPrecondition),
        (grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE", errors.Unavailable),
        (grpc.StatusCode.INVALID_ARGUMENT, "KEY_INVALID", errors.InvalidArgument),
        (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", errors.Unauthenticated),
        (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND", errors.NotFound),
    ],
)
def test_an_error_info_of_another_domain_is_the_status_code_s_generic_error(
    domain: str, code: grpc.StatusCode, reason: str, generic: type[errors.FencepostError],
) -> None:
    """A proxy or another service in front may send an ErrorInfo whose reason
    happens to be one of fencepost's: it says nothing about fencepost's state
    (a LeaseFenced from a proxy must not make a holder stop), so it is read
    as if there were no ErrorInfo at all."""
    err = translate(_failed(code, _info(reason, domain, generation="3")))
    assert type(err) is generic
    assert (err.code, err.reason, err.metadata, err.message) == (code.name, "", {}, "refused")


def test_fencepost_s_error_info_wins_over_another_domain_s_in_either_order() -> None:
    ours, theirs = _info("SEQUENCE_MISMATCH", reasons.DOMAIN, head="4"), _info("LEASE_FENCED", "proxy.example.com")
    for infos in ((ours, theirs), (theirs, ours)):
        err = translate(_failed(grpc.StatusCode.FAILED_PRECONDITION, *infos))
        assert type(err) is errors.SequenceMismatch
        assert (err.reason, err.metadata) == ("SEQUENCE_MISMATCH", {"head": "4"})
