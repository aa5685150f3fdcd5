"""What the second-language suites share: Node.js tools (a missing one fails
the test, never skips it) and `fencepost serve` as a subprocess."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: the second-language client suites need Node.js >= 18 and npm")
    return path


def npm_ci(package_dir: Path) -> None:
    """The package's locked npm dependencies (scripts/npm_ci.sh: `npm ci` only
    when node_modules is missing or from another lockfile)."""
    tool("node")
    tool("npm")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "npm_ci.sh"), str(package_dir)], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        pytest.fail(f"npm ci in {package_dir} failed:\n{result.stdout}\n{result.stderr}")


@contextlib.contextmanager
def serve(backend: str, *extra: str) -> Iterator[str]:
    """`fencepost serve` on a free loopback port; yields the host:port it bound."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencepost_server", "serve", "--listen", "127.0.0.1:0",
         "--backend", backend, "--grace", "1", "--log-level", "WARNING", *extra],
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
