"""The TypeScript client's own test suite (client/typescript/test), run by
pytest against a live `fencepost serve` on memory and on SQLite.

`npm ci` from the committed lockfile (scripts/npm_ci.sh), then `npm test`
(tsc, then `node --test`): KV and compare-and-set, typed errors with the
ErrorReason enum, the LeasedSession helper fenced by a takeover, the shared
key vectors, the retry rules. The README's example runs too. Fails, never
skips, when Node.js or npm is missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.polyglot.serving import ROOT, npm_ci, serve, tool

PACKAGE = ROOT / "client" / "typescript"
TEST_FILES = sorted(PACKAGE.glob("test/*.test.ts"))
# the oversized-request test sends 3 MiB; the server under test takes at most 2 MiB
MAX_RECEIVE = str(2 * 1024 * 1024)


def _backend(name: str, tmp: Path) -> str:
    return {"memory": "memory://", "sqlite": f"sqlite:///{tmp / 'fencepost.db'}"}[name]


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_typescript_client_suite(backend: str, tmp_path: Path) -> None:
    npm = tool("npm")
    npm_ci(PACKAGE)
    with serve(_backend(backend, tmp_path), "--max-receive-bytes", MAX_RECEIVE) as target:
        env = {**os.environ, "FENCEPOST_TARGET": target}
        result = subprocess.run([npm, "test"], cwd=PACKAGE, env=env, capture_output=True, text=True, timeout=600)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        counts = {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|skipped|todo|cancelled) (\d+)$", out, re.M)}
        assert counts.get("fail") == 0 and counts.get("skipped") == 0 and counts.get("todo") == 0, out
        assert counts.get("cancelled") == 0, out
        # every test file ran and each contributed tests
        assert counts["pass"] == counts["tests"] >= 20, out
        for name in ("kv", "errors", "session", "vectors", "retry", "time", "reach", "classes"):
            assert PACKAGE / "test" / f"{name}.test.ts" in TEST_FILES

        # the example finds the server as the Python SDK and the CLI do (it
        # read a variable of its own, FENCEPOST_TARGET, here a dead port)
        example_env = {**os.environ, "FENCEPOST_ENDPOINT": target, "FENCEPOST_TARGET": "127.0.0.1:1"}
        example = subprocess.run(
            [tool("node"), "dist/example/quickstart.js"],
            cwd=PACKAGE, env=example_env, capture_output=True, text=True, timeout=120,
        )
        assert example.returncode == 0, example.stdout + example.stderr
        assert "compare-and-set applied=true" in example.stdout and "empty key refused: KEY_INVALID" in example.stdout


def test_without_node_the_suites_fail_rather_than_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(pytest.fail.Exception, match="node is not installed"):
        tool("node")
    # and `make check` / `make generate` stop at the install step
    bash = "/bin/bash"
    result = subprocess.run(
        [bash, str(ROOT / "scripts" / "npm_ci.sh"), str(PACKAGE)], env={"PATH": "/nonexistent"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0 and "npm is not installed" in result.stderr


def test_typed_errors_cover_every_reason_the_javascript_checks_cover() -> None:
    from fencepost.contract import enum_reasons

    reasons = set(enum_reasons())
    checks = ROOT / "tests" / "polyglot" / "checks"
    quoted = {r for p in checks.glob("*.mjs") for r in re.findall(r'"([A-Z][A-Z_]+)"', p.read_text())}
    in_checks = quoted & reasons
    in_typescript = {r for p in TEST_FILES for r in re.findall(r"ErrorReason\.([A-Z_]+)", p.read_text())}
    assert len(in_checks) >= 10
    assert in_checks <= in_typescript, f"add TypeScript tests for {sorted(in_checks - in_typescript)}"


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """client/typescript/README.md's example, compiled with tsc (strict) with
    the package's sources (into the test's own directory: the suites above
    build dist/ meanwhile) and run against a live server, twice (it names
    fixed keys): it prints what it says, and nothing about a lost session."""
    npm_ci(PACKAGE)
    block = re.search(r"```ts\n(.*?)```", (PACKAGE / "README.md").read_text(), re.S)
    assert block, "the README's example is gone"
    lines = block.group(1).splitlines()
    src = json.dumps(os.path.relpath(PACKAGE / "src", tmp_path))
    imports = [line.replace('"@fencepost/client"', src) for line in lines if line.startswith("import ")]
    body = "".join(f"  {line}\n" for line in lines if not line.startswith("import "))
    out = tmp_path / "out"
    with serve("memory://") as target:
        source = "\n".join(imports) + f"\n\nasync function main(): Promise<void> {{\n{body}}}\n\n" + (
            "main().catch((err) => { console.error(err); process.exitCode = 1; });\n"
        )
        (tmp_path / "readme.ts").write_text(source.replace("127.0.0.1:50051", target))
        compiled = subprocess.run(
            [str(PACKAGE / "node_modules" / ".bin" / "tsc"), "--strict", "--target", "ES2022", "--module", "commonjs",
             "--esModuleInterop", "--skipLibCheck", "--types", "node",
             "--typeRoots", str(PACKAGE / "node_modules" / "@types"),
             "--rootDir", "/", "--outDir", str(out), str(tmp_path / "readme.ts")],
            capture_output=True, text=True, timeout=300,
        )
        assert compiled.returncode == 0, compiled.stdout + compiled.stderr
        script = out / tmp_path.relative_to("/") / "readme.js"
        env = {**os.environ, "NODE_PATH": str(PACKAGE / "node_modules")}
        for _ in range(2):
            run = subprocess.run([tool("node"), str(script)], env=env, capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stdout + run.stderr
            assert run.stdout.startswith("KEY_INVALID "), run.stdout
            assert "lost the session" not in run.stdout, run.stdout


def test_both_sdks_name_each_reason_s_error_class_alike() -> None:
    """Python's `errors.LeaseFenced` is TypeScript's `LeaseFencedError`, under
    the same status code's class, for every reason of the enum."""
    from fencepost import errors
    from fencepost.contract import enum_reasons

    source = (PACKAGE / "src" / "errors.ts").read_text()
    typescript = dict(re.findall(r"\[ErrorReason\.([A-Z_]+)\]: (\w+),", source))
    parents = dict(re.findall(r"export class (\w+) extends (\w+)", source))
    for reason in enum_reasons():
        py = errors.BY_REASON[reason]
        assert typescript.get(reason) == py.__name__ + "Error", reason
        # the same status meaning: the TypeScript class's parent is the Python parent's name + "Error"
        ts_parent = parents[typescript[reason]]
        py_parent = py.__mro__[1].__name__ if py not in errors.BY_CODE.values() else "FencepostError"
        expected = py_parent if py_parent == "FencepostError" else py_parent + "Error"
        assert ts_parent == expected, (reason, ts_parent, expected)
