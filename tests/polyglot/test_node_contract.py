"""The JavaScript contract suite (tests/polyglot/contract.mjs), run by pytest.

Installs the locked npm dependencies (`npm ci`, only when node_modules is
missing or older than package-lock.json), starts `fencepost serve` on a free
loopback port as a subprocess, and runs the suite with node against it. Fails,
never skips, when node or npm is missing: a second-language client is part of
the contract.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polyglot.serving import npm_ci, serve, tool

HERE = Path(__file__).resolve().parent
CHECKS = sorted(p.stem for p in (HERE / "checks").glob("*.mjs"))


@pytest.fixture(scope="module")
def fencepost_target() -> Iterator[str]:
    """`fencepost serve` on a free loopback port (the server reports the port it bound)."""
    with serve("memory://") as target:
        yield target


def test_javascript_contract_suite(fencepost_target: str) -> None:
    node = tool("node")
    npm_ci(HERE)
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
    # and every service of the proto has a check
    assert "# note: no JavaScript check covers" not in out, out
