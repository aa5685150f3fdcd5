"""Collects each run's figures and prints the table at the end of the session."""

from __future__ import annotations

import pytest

from .figures import table
from .suite import LONG, Figures

COLLECTED: list[Figures] = []


@pytest.fixture
def collect() -> list[Figures]:
    return COLLECTED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COLLECTED:
        terminalreporter.section(f"reliability figures ({'long' if LONG else 'short'} profile)")
        terminalreporter.write_line(table(COLLECTED))
