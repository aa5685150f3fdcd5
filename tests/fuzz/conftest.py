"""Prints what the wire fuzz suite sent and what came back, per backend."""

from __future__ import annotations

import pytest

from .harness import Tally

TALLIES: dict[str, Tally] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for backend, tally in TALLIES.items():
        terminalreporter.section(f"wire fuzz: {backend}")
        terminalreporter.write_line(tally.table())
