"""The backup archive: portable, versioned, checksummed JSON lines.

    {"format": "fencepost-archive", "v": 2, "created": ..., "source": "sqlite",
     "consistency": "snapshot" | "logical", "watermarks": [...]}          header
    {"chunk": 0, "items": [[key, value (base64), version], ...], "sha256": h}
    ...                                                                     in key order
    {"end": true, "chunks": N, "items": M, "quiesced": bool, "sha256": H}  trailer

A chunk's `sha256` is over the compact JSON of its `items` exactly as
written; the trailer's is over the header line, every chunk's hash, and
(from v2) `quiesced=true` / `quiesced=false`, so a dropped, repeated or
reordered chunk, an edited header, a flipped `quiesced` or a missing trailer
is caught as surely as a flipped byte. v1 archives (whose `quiesced` no hash
covered) are still read; their flag is reported as not quiesced. Files ending in
`.gz` are gzip-compressed. An archive is written to `FILE.partial` and
renamed when complete, so a backup that dies leaves no file that looks whole.

Nothing in it is backend-specific: an archive of one backend restores into
any other.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import os
import stat
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from ..storage import Item, private

FORMAT = "fencepost-archive"
VERSION = 2  # 2: the trailer's sha256 covers `quiesced` too
READS = (1, 2)


class ArchiveError(Exception):
    """The archive is not a complete, intact fencepost archive."""


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


_GZIP_MAGIC = b"\x1f\x8b"


def _quiesced_line(quiesced: bool) -> bytes:
    """What the trailer's sha256 takes in for the flag (v2): an edited flag fails it."""
    return b"quiesced=true" if quiesced else b"quiesced=false"


def _open(path: Path, mode: str) -> IO[bytes]:
    """For writing: compressed when the name ends in `.gz` (reading tells from
    the file's first bytes, whatever its name: archives get renamed)."""
    compressed = path.name.endswith(".gz") or path.name.endswith(".gz.partial")
    private.create_file(path)  # it holds every stored item
    if compressed:
        return gzip.open(path, mode)  # type: ignore[return-value]
    return path.open(mode)


@dataclass
class Header:
    source: str
    consistency: str  # "snapshot" (point in time) or "logical" (read live)
    watermarks: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    v: int = VERSION

    def line(self) -> bytes:
        return (_compact({"format": FORMAT, "v": self.v, "created": self.created, "source": self.source,
                          "consistency": self.consistency, "watermarks": self.watermarks}) + "\n").encode()


@dataclass
class Trailer:
    chunks: int
    items: int
    quiesced: bool


class ArchiveWriter:
    """Writes `path.partial`; `finish` adds the trailer and renames it to `path`."""

    def __init__(self, path: Path, header: Header) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self._file = _open(self.partial, "wb")
        with contextlib.suppress(FileNotFoundError):  # renamed over an existing archive: it keeps its mode
            os.chmod(self.partial, stat.S_IMODE(path.stat().st_mode))
        line = header.line()
        self._file.write(line)
        self._digest = hashlib.sha256(line)
        self.chunks = 0
        self.items = 0

    def write(self, items: list[Item]) -> None:
        if not items:
            return
        body = _compact([[i.key, base64.b64encode(i.value).decode(), i.version] for i in items])
        sha = hashlib.sha256(body.encode()).hexdigest()
        self._file.write(f'{{"chunk":{self.chunks},"items":{body},"sha256":"{sha}"}}\n'.encode())
        self._digest.update(sha.encode())
        self.chunks += 1
        self.items += len(items)

    def finish(self, *, quiesced: bool) -> Trailer:
        trailer = Trailer(self.chunks, self.items, quiesced)
        self._digest.update(_quiesced_line(quiesced))
        self._file.write((_compact({"end": True, "chunks": self.chunks, "items": self.items, "quiesced": quiesced,
                                    "sha256": self._digest.hexdigest()}) + "\n").encode())
        self._file.close()
        with self.partial.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(self.partial, self.path)
        # the rename itself is durable only once the directory is: a backup
        # that reported success must not vanish in a power loss
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return trailer

    def abandon(self) -> None:
        self._file.close()
        self.partial.unlink(missing_ok=True)


def _parse(line: bytes, where: str) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise ArchiveError(f"{where}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ArchiveError(f"{where}: not a JSON object")
    return value


def _header(line: bytes) -> Header:
    if not line:
        raise ArchiveError("not a fencepost archive (the file is empty)")
    try:
        raw = _parse(line, "line 1")
    except ArchiveError:
        raise ArchiveError("not a fencepost archive (its first line is not a JSON header)") from None
    if raw.get("format") != FORMAT:
        raise ArchiveError("not a fencepost archive (no header)")
    if raw.get("v") not in READS:
        raise ArchiveError(f"archive format version {raw.get('v')!r} is not supported "
                           f"(this build reads {', '.join(map(str, READS))})")
    try:
        return Header(str(raw["source"]), str(raw["consistency"]), [str(w) for w in raw.get("watermarks") or []],
                      str(raw["created"]), int(raw["v"]))
    except (KeyError, TypeError) as exc:
        raise ArchiveError(f"line 1: malformed header ({exc!r})") from None


def _items(raw: dict[str, Any], where: str) -> list[Item]:
    body = raw.get("items")
    if not isinstance(body, list) or not isinstance(raw.get("sha256"), str):
        raise ArchiveError(f"{where}: a chunk needs items and sha256")
    if hashlib.sha256(_compact(body).encode()).hexdigest() != raw["sha256"]:
        raise ArchiveError(f"{where}: chunk {raw.get('chunk')} fails its sha256")
    try:
        return [Item(str(k), base64.b64decode(v, validate=True), str(ver)) for k, v, ver in body]
    except (ValueError, TypeError) as exc:
        raise ArchiveError(f"{where}: malformed item ({exc})") from None


def _unreadable(exc: BaseException) -> ArchiveError:
    """The reader's failures, without the path (the commands name the file)."""
    if isinstance(exc, EOFError):  # gzip: the compressed stream stops early
        return ArchiveError(f"the archive is truncated ({exc})")
    if isinstance(exc, zlib.error):  # gzip: a damaged compressed stream
        return ArchiveError(f"the archive's compressed data is damaged ({exc})")
    return ArchiveError(f"cannot read the archive: {exc}")


class ArchiveReader:
    """Reads an archive, checking every checksum as it goes. `verify()` reads
    it whole first (a restore does, before it writes anything)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            # Every pass reads this one open file: an archive renamed over
            # `path` meanwhile (the next backup) is not the one verified.
            self._fd = os.open(path, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fd)
            with self._reading() as f:
                self.header = _header(f.readline())
        except (OSError, EOFError, zlib.error) as exc:
            raise _unreadable(exc) from exc
        self.trailer: Trailer | None = None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[IO[bytes]]:
        """The file from its start; decompressed when it starts like gzip."""
        with os.fdopen(os.dup(self._fd), "rb") as raw:  # (passes run one after another)
            raw.seek(0)
            compressed = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
            if not compressed:
                yield raw
                return
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f  # type: ignore[misc]

    def chunks(self, *, complete: bool = True) -> Iterator[list[Item]]:
        """Every chunk's items, in order. With `complete`, the trailer must
        close the archive and match it (else ArchiveError after the last chunk)."""
        self.trailer = None
        try:
            with self._reading() as f:
                first = f.readline()
                digest = hashlib.sha256(first)
                expected, count = 0, 0
                previous: bytes | None = None
                for n, line in enumerate(f, start=2):
                    where = f"line {n}"
                    if self.trailer is not None:
                        raise ArchiveError(f"{where}: data after the trailer")
                    raw = _parse(line, where)
                    if raw.get("end") is True:
                        self._close(raw, digest, expected, count)
                        continue
                    if raw.get("chunk") != expected:
                        raise ArchiveError(f"{where}: chunk {raw.get('chunk')!r} where chunk {expected} belongs")
                    items = _items(raw, where)
                    for item in items:
                        key = item.key.encode()
                        if previous is not None and key <= previous:
                            raise ArchiveError(f"{where}: keys out of order at {item.key!r}")
                        previous = key
                    digest.update(raw["sha256"].encode())
                    expected += 1
                    count += len(items)
                    yield items
        except (OSError, EOFError, zlib.error, UnicodeError) as exc:  # UnicodeError: a key UTF-8 cannot hold
            raise _unreadable(exc) from exc
        if complete and self.trailer is None:
            raise ArchiveError("the archive ends without its trailer (truncated)")

    def _close(self, raw: dict[str, Any], digest: Any, chunks: int, items: int) -> None:
        if raw.get("chunks") != chunks or raw.get("items") != items:
            raise ArchiveError(f"trailer says {raw.get('chunks')} chunks / {raw.get('items')} items; "
                               f"the archive holds {chunks} / {items}")
        quiesced = raw.get("quiesced")
        if not isinstance(quiesced, bool):
            raise ArchiveError(f"trailer: quiesced is {quiesced!r}, not true or false")
        if self.header.v >= 2:
            digest.update(_quiesced_line(quiesced))
        if raw.get("sha256") != digest.hexdigest():
            raise ArchiveError("the trailer's sha256 does not match the header, chunks and quiesced flag")
        # a v1 flag is covered by no hash: it cannot vouch for a quiesced source
        self.trailer = Trailer(chunks, items, quiesced and self.header.v >= 2)

    def verify(self) -> Trailer:
        for _ in self.chunks():
            pass
        assert self.trailer is not None
        return self.trailer
