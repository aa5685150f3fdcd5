"""The declared-reasons check fails a test run whose server returns a reason
its RPC does not declare: in a scratch copy of the code, a servicer is made
to raise one, and a pytest session there passes its test yet fails at the
end, naming the option line to add (an unmodified copy passes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRATCH_TEST = '''
import contextlib

import fencepost
from fencepost_server.storage.memory import MemoryStorage
from tests.conftest import running


async def test_get_once() -> None:
    async with running(MemoryStorage()) as srv, srv.client(timeout=10.0) as c:
        with contextlib.suppress(fencepost.FencepostError):
            await c.get("k")
'''

_GET_BODY = "kv_pb2.GetRequest, context: grpc.aio.ServicerContext) -> kv_pb2.GetResponse:\n"
_UNDECLARED = (
    "        from ..domain.errors import FailedPrecondition\n"
    "        raise FailedPrecondition('LEASE_HELD', 'a reason KvService.Get does not declare')\n"
)


def _scratch(tmp: Path) -> Path:
    work = tmp / "work"
    ignore = shutil.ignore_patterns("__pycache__", "node_modules", "*.egg-info")
    for name in ("client", "server", "tests"):
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    (work / "tests" / "api" / "test_scratch_get.py").write_text(_SCRATCH_TEST)
    return work


def _run(work: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(str(work / p) for p in ("client", "server", "."))
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/api/test_scratch_get.py"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )


def test_a_servicer_raising_an_undeclared_reason_fails_the_run(tmp_path: Path) -> None:
    work = _scratch(tmp_path)
    clean = _run(work)
    out = clean.stdout + clean.stderr
    assert clean.returncode == 0, out
    assert "1 passed" in out and "all declared" in out and str(work) in _imported_from(work)

    kv = work / "server" / "fencepost_server" / "api" / "kv.py"
    text = kv.read_text()
    assert text.count(_GET_BODY) == 1
    kv.write_text(text.replace(_GET_BODY, _GET_BODY + _UNDECLARED))

    broken = _run(work)
    out = broken.stdout + broken.stderr
    assert broken.returncode != 0, out
    assert "1 passed" in out, out  # the test itself passed: the session-end check failed the run
    assert (
        "/fencepost.v1.KvService/Get returned FAILED_PRECONDITION/LEASE_HELD, which it does not declare: "
        "add `option (fencepost.v1.reasons) = ERROR_REASON_LEASE_HELD;` to rpc Get in proto/fencepost/v1/kv.proto"
    ) in out, out


def _imported_from(work: Path) -> str:
    """Where the scratch run imports fencepost_server from (must be the copy)."""
    path = os.pathsep.join(str(work / p) for p in ("client", "server", "."))
    return subprocess.run(
        [sys.executable, "-c", "import fencepost_server; print(fencepost_server.__file__)"],
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, check=True,
    ).stdout
