"""Warnings from loops that repeat while an outage lasts (janitor, erasure
and retention passes, journal flushes): the first failure is logged at once,
then at most one line per interval with how many were held back, and one
line on recovery. A backend down for an hour is a handful of lines, not 720."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

DEFAULT_INTERVAL = 60.0


class ThrottledWarning:
    def __init__(self, logger: logging.Logger, what: str, *, every: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.what, self.every, self.clock = logger, what, every, clock
        self.failing = False
        self.held = 0
        self._logged_at = 0.0

    def failed(self, error: object) -> None:
        now = self.clock()
        if self.failing and now - self._logged_at < self.every:
            self.held += 1
            return
        more = f" ({self.held} more since the last report)" if self.held else ""
        self.logger.warning("%s failed: %s%s", self.what, error, more)
        self.failing, self.held, self._logged_at = True, 0, now

    def ok(self) -> None:
        if self.failing:
            self.logger.warning("%s works again", self.what)
        self.failing, self.held = False, 0
