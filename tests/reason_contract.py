"""The declared-reasons check, wired into every test session by conftest.py.

At start-up the session (the controller, under pytest-xdist) points `FENCEPOST_RECORD_REASONS` at a fresh file,
so every server the tests start (in process, and `fencepost serve`
subprocesses, which inherit the environment) records each
(method, status code, ErrorInfo reason) it returns
(fencepost_server.api.recording). At the end the records are compared with
what each RPC declares in the proto (fencepost.contract); a reason an RPC
does not declare fails the run, with the exact line to add.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from fencepost.contract import undeclared
from fencepost_server.api.recording import ENV

_STATE: dict[str, object] = {}


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # not the environment: a nested pytest inherits that


def start(config: pytest.Config) -> None:
    """A fresh record file for this session (never one inherited from an outer session).

    Under pytest-xdist the controller makes the file and its workers, which
    inherit the environment, append to it; the controller checks it at the end."""
    if _xdist_worker(config) and os.environ.get(ENV):
        return
    fd, path = tempfile.mkstemp(prefix="fencepost-reasons-", suffix=".tsv")
    os.close(fd)
    os.environ[ENV] = path
    _STATE["path"] = Path(path)


def recorded(path: Path) -> set[tuple[str, str, str]]:
    seen = set()
    for line in path.read_text().splitlines():
        method, code, reason = (line.split("\t") + ["", ""])[:3]
        seen.add((method, code, reason))
    return seen


def finish(session: pytest.Session) -> None:
    path = _STATE.get("path")
    if not isinstance(path, Path) or not path.exists():
        return
    seen = recorded(path)
    problems = undeclared(seen)
    _STATE["summary"] = (len(seen), problems)
    path.unlink()
    if problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def report(terminalreporter: pytest.TerminalReporter) -> None:
    summary = _STATE.get("summary")
    if not summary:
        return
    count, problems = summary  # type: ignore[misc]
    if problems:
        terminalreporter.section("undeclared error reasons", red=True)
        for line in problems:
            terminalreporter.line(f"FAILED reason contract: {line}", red=True)
    else:
        terminalreporter.line(f"reason contract: {count} distinct (method, code, reason) seen, all declared")
