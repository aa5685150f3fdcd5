"""Run moto's DynamoDB-compatible server on 127.0.0.1:PORT until stdin closes.

    python -m tests.moto_launcher PORT

Requests are executed one at a time. moto applies TransactWriteItems by
snapshotting the whole table and restoring the snapshot when a condition
fails, and checks a condition and writes without a lock; on its threaded
server a restore therefore drops writes that other requests made meanwhile,
and two conditional writes can both pass. (Two fencepost processes doing CAS
increments lost updates that way.) Real DynamoDB does neither, so the tests
serialise request execution with one lock; connections are still accepted
concurrently. moto is CPU-bound under the GIL anyway, so little is lost.

The process exits as soon as its stdin closes, so it never outlives the test
session (or benchmark) that started it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def one_at_a_time(app: Wsgi) -> Wsgi:
    lock = threading.Lock()

    def serialised(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))  # the body is produced under the lock too

    return serialised


def main() -> None:
    port = int(sys.argv[1])
    app = one_at_a_time(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    main()
