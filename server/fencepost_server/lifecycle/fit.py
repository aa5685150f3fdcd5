"""Items a target backend cannot hold, refused by name before they are written.

SQLite holds any value and any key; a DynamoDB item is at most 400 KB
(409,600 bytes: every attribute's UTF-8 name plus its value) and its key
must fit the table's key limits. A store that grew on SQLite (larger
configured limits, or data older than them) may hold items that a migration
or restore into DynamoDB cannot write. BatchWriteItem would refuse the whole
request with a ValidationException naming no item; this check names the key
and its size instead. (Operator tooling: it reads the DynamoDB backend's key
codec, and changes nothing on its request paths.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..storage import Item, Storage, StorageError
from .stores import Exit, LifecycleError

#: DynamoDB's item size limit ("400 KB"), in bytes
DYNAMODB_MAX_ITEM_BYTES = 400 * 1024


def item_sizer(target: Storage) -> Callable[[Item], int] | None:
    """How many bytes `target` counts against its item limit for an item, or
    None when it has no such limit (SQLite, memory). Raises StorageError for
    a key the target cannot hold at all."""
    try:
        from ..storage.dynamodb import DynamoStorage
        from ..storage.dynamodb.codec import attributes_bytes
        from ..storage.dynamodb.table import VALUE, VERSION
    except ImportError:  # installed without the DynamoDB extra: no DynamoDB target either
        return None
    if not isinstance(target, DynamoStorage):
        return None
    codec = target.codec

    def size(item: Item) -> int:
        _, key_attrs = codec.key_attributes(item.key)
        return attributes_bytes({**key_attrs, VALUE: {"B": item.value}, VERSION: {"S": item.version}})

    return size


def refuse_unfit(
    sizer: Callable[[Item], int] | None, items: Iterable[Item], target_url: str, then: str = ""
) -> None:
    """REFUSED, naming the first item the target cannot hold (`then`: what to do after fixing it)."""
    if sizer is None:
        return
    for item in items:
        try:
            size = sizer(item)
        except StorageError as exc:
            raise LifecycleError(f"{target_url} cannot hold the item {item.key!r}: {exc}. Shorten or delete "
                                 f"that key in the source, or keep this store on SQLite{then}", Exit.REFUSED) from None
        if size > DYNAMODB_MAX_ITEM_BYTES:
            raise LifecycleError(
                f"{target_url} cannot hold the item {item.key!r}: {size:,} bytes with its key and version, over "
                f"DynamoDB's 400 KB item limit ({DYNAMODB_MAX_ITEM_BYTES:,} bytes). Shrink or delete that item "
                f"in the source, or keep this store on SQLite{then}", Exit.REFUSED)
