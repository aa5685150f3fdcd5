"""A request the backend refused as malformed (DynamoDB's
ValidationException) is a server bug: INTERNAL, with a message that says so,
and a log line naming the RPC and what the backend refused."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.rpc import error_details_pb2

from fencepost_server.api.base import _failure
from fencepost_server.storage import RequestRejected


def test_a_rejected_request_is_internal_and_logged_with_what_was_refused(caplog: pytest.LogCaptureFixture) -> None:
    refused = RequestRejected("PutItem of key 't/kv/a': ValidationException: Item size has exceeded the maximum")
    with caplog.at_level(logging.ERROR, logger="fencepost.rpc"):
        (code, reason), status = _failure("/fencepost.v1.KvService/Put", refused)
    assert (code, reason) == ("INTERNAL", "INTERNAL") and status.code == grpc.StatusCode.INTERNAL.value[0]
    assert "refused the request as malformed" in status.message and "server log" in status.message
    assert "t/kv/a" not in status.message  # what the backend said stays in the server's log
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert info.reason == "INTERNAL"
    logged = [r for r in caplog.records if r.name == "fencepost.rpc"]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    line = logged[0].getMessage()
    assert "/fencepost.v1.KvService/Put" in line and str(refused) in line and "unhandled" not in line
