"""The JavaScript contract suite (tests/polyglot/contract.mjs), run by pytest.

Installs the locked npm dependencies (`npm ci`, only when node_modules is
missing or older than package-lock.json), starts `fencepost serve` on a free
loopback port as a subprocess, and runs the suite with node against it. Fails,
never skips, when node or npm is missing: a second-language client is part of
the contract.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STAMP = HERE / "node_modules" / ".fencepost-lock-sha256"
CHECKS = sorted(p.stem for p in (HERE / "checks").glob("*.mjs"))


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: the JavaScript contract suite needs Node.js >= 18 and npm")
    return path


def _npm_ci() -> None:
    """`npm ci` into tests/polyglot/node_modules unless it matches the lockfile."""
    lock = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.is_file() and STAMP.read_text().strip() == lock:
        return
    result = subprocess.run(
        [_tool("npm"), "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
        cwd=HERE, capture_output=True, text=True, timeout=600,
    )
    if result.returncode != 0:
        pytest.fail(f"npm ci failed:\n{result.stdout}\n{result.stderr}")
    STAMP.write_text(lock)


@pytest.fixture(scope="module")
def fencepost_target() -> Iterator[str]:
    """`fencepost serve` on a free loopback port (the server reports the port it bound)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0",
         "--backend", "memory://", "--grace", "1", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        match = re.search(r"serving on (127\.0\.0\.1:\d+)", banner)
        if match is None:
            proc.kill()
            pytest.fail(f"fencepost serve did not start: {banner}{proc.stdout.read()}")
        yield match.group(1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_javascript_contract_suite(fencepost_target: str) -> None:
    node = _tool("node")
    _npm_ci()
    result = subprocess.run(
        [node, "contract.mjs"], cwd=HERE, capture_output=True, text=True, timeout=300,
        env={**os.environ, "FENCEPOST_TARGET": fencepost_target},
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "not ok" not in out and "# pass " in out, out
    passed = int(re.search(r"# pass (\d+) fail 0", out).group(1))  # type: ignore[union-attr]
    # every service the checks need has landed: each check must run, none is "not applicable"
    assert "# not applicable" not in out, out
    assert passed == len(CHECKS) and {"ledger", "journal", "schedule"} <= set(CHECKS), out
