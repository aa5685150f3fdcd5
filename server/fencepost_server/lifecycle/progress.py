"""Progress for the operator commands: a bar redrawn in place on a terminal,
a line every few seconds otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, TextIO

_BAR = 30


class Progress:
    def __init__(self, what: str, total: int | None = None, *, stream: TextIO | None = None,
                 interval: float = 5.0) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self._base = 0  # items done before this run (a resumed migration)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = 0.1 if self.tty else interval
        self.started = time.monotonic()
        # a terminal's bar is drawn at once; a log's first line comes after one
        # interval, so a short run logs its final line only, not the same count twice
        self._shown = 0.0 if self.tty else self.started

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return (self.done - self._base) / elapsed if elapsed > 0 else 0.0

    def resume(self, done: int) -> None:
        """Count from `done` items already done by an earlier run."""
        self.done = self._base = done

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._shown >= self.interval:
            self._shown = now
            self._show(final=False)

    def finish(self) -> None:
        self._show(final=True)

    def _show(self, *, final: bool) -> None:
        counts = f"{self.done:,}" + (f"/{self.total:,}" if self.total else "")
        text = f"{self.what}: {counts} items, {self.rate():,.0f}/s"
        if self.tty:
            if self.total:
                filled = min(_BAR, _BAR * self.done // max(self.total, 1))
                text = f"[{'#' * filled}{'.' * (_BAR - filled)}] {text}"
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


async def tracked(pages: AsyncIterable[list[Any]], progress: Progress) -> AsyncIterator[list[Any]]:
    """`pages`, advancing `progress` by each page's length; finished at the end."""
    async for page in pages:
        progress.advance(len(page))
        yield page
    progress.finish()
