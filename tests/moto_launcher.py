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

moto also deep-copies the whole table once per *item* of a TransactWriteItems
(its rollback snapshot), so a transaction's cost grew with its item count
times the table's size. Here a failed transaction is rolled back from the
before-images of the items it names instead (`_undo_log_rollback`).

The process exits as soon as its stdin closes, so it never outlives the test
session (or benchmark) that started it.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import types
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


def _undo_log_rollback() -> None:
    """Roll a failed TransactWriteItems back from the items it names instead
    of a snapshot of the whole table. Safe because requests run one at a time
    (`one_at_a_time`); a transaction whose keys cannot be read up front keeps
    moto's own snapshot."""
    import moto.dynamodb.models as models

    # what the patch relies on (moto is pinned in constraints.txt); fail loudly if it moved
    assert models.copy is copy and callable(getattr(models.Item, "to_json", None))
    apply = models.DynamoDBBackend.transact_write_items
    no_table_copy = types.SimpleNamespace(
        deepcopy=lambda obj, memo=None: obj if isinstance(obj, models.Table) else copy.deepcopy(obj, memo)
    )

    def before_images(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
        images = []
        for entry in transact_items:
            for op in entry.values():
                table = backend.get_table(op["TableName"])
                key = op.get("Key") or {
                    attr: op["Item"][attr] for attr in (table.hash_key_attr, table.range_key_attr) if attr
                }
                item = backend.get_item(op["TableName"], key)
                images.append((op["TableName"], key, None if item is None else item.to_json()["Attributes"]))
        return images

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        try:
            images = before_images(self, transact_items)
        except Exception:
            return apply(self, transact_items)  # malformed: moto validates and answers
        models.copy = no_table_copy  # type: ignore[assignment]
        try:
            apply(self, transact_items)
        except Exception:
            for table_name, key, attributes in reversed(images):
                if attributes is None:
                    self.delete_item(table_name, key)
                else:
                    self.put_item(table_name, attributes)
            raise
        finally:
            models.copy = copy  # type: ignore[assignment]

    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def main() -> None:
    _undo_log_rollback()
    port = int(sys.argv[1])
    app = one_at_a_time(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()
    os._exit(0)


if __name__ == "__main__":
    main()
