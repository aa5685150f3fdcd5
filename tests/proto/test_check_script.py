"""scripts/check.sh guards the wire contract: in a scratch copy of the repo,
renumbering a field (with the generated code and docs regenerated, so only
the contract changed) makes the check fail in `buf breaking`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = Path(sys.executable)


def _scratch(tmp: Path) -> tuple[Path, Path]:
    """A copy of what check.sh reads, and a baseline holding the original proto."""
    work, base = tmp / "work", tmp / "base"
    for name in ("proto", "scripts", "docs", "client/fencepost/v1"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    ts = "client/typescript"
    subprocess.run(["bash", str(ROOT / "scripts" / "npm_ci.sh"), str(ROOT / ts)], check=True, timeout=600)
    shutil.copytree(ROOT / ts, work / ts, ignore=shutil.ignore_patterns("node_modules", "dist"))
    (work / ts / "node_modules").symlink_to(ROOT / ts / "node_modules")
    shutil.copy(ROOT / "buf.yaml", work / "buf.yaml")
    shutil.copytree(ROOT / "proto", base / "proto")
    shutil.copy(ROOT / "buf.yaml", base / "buf.yaml")
    return work, base


def _check(work: Path, base: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PY": str(PY), "BUF_AGAINST": str(base), "GIT_CEILING_DIRECTORIES": str(work.parent)}
    return subprocess.run(
        ["bash", str(work / "scripts" / "check.sh")], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


def test_check_fails_when_a_field_number_changes(tmp_path: Path) -> None:
    work, base = _scratch(tmp_path)
    unchanged = _check(work, base)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert f"buf breaking clean against {base}" in unchanged.stdout

    kv = work / "proto" / "fencepost" / "v1" / "kv.proto"
    text, n = re.subn(r"(message GetRequest \{\n  // The key.\n  string key = )1;", r"\g<1>7;", kv.read_text())
    assert n == 1
    kv.write_text(text)
    env = {**os.environ, "PY": str(PY)}
    subprocess.run(["bash", "scripts/generate.sh"], cwd=work, env=env, check=True, timeout=300)
    subprocess.run([str(PY), "scripts/proto_docs.py"], cwd=work, check=True, timeout=300)

    broken = _check(work, base)
    out = broken.stdout + broken.stderr
    assert broken.returncode != 0, out
    assert "check: generated code is fresh" in out and "docs/reference.md is fresh" in out  # only buf breaking fails
    assert "GetRequest" in out and "buf breaking clean" not in out
