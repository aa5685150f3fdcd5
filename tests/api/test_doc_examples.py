"""The Python examples of the README and docs/, run as written against a real
server: each block in a fresh interpreter, its `127.0.0.1:50051` pointed at
the test's server. (The README's holder loop has its own test in
test_operator_experience.py.)"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fencepost_server.storage.memory import MemoryStorage
from tests.conftest import RunningServer, running

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TARGET = "127.0.0.1:50051"


@pytest.fixture
async def srv() -> AsyncIterator[RunningServer]:
    async with running(MemoryStorage()) as s:
        yield s


def python_block(doc: str, after: str) -> str:
    text = (ROOT / doc).read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(after):], re.S)
    assert match, f"the example after {after!r} in {doc} is gone"
    return match.group(1)


async def run_script(script: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def in_async_main(block: str, preamble: str = "", epilogue: str = "") -> str:
    body = "".join(f"    {line}\n" for line in (preamble + block + epilogue).splitlines())
    return f"import asyncio\nimport fencepost\n\nasync def main():\n{body}\nasyncio.run(main())\n"


async def test_readme_python_quickstart_prints_what_its_comments_say(srv: RunningServer) -> None:
    block = python_block("README.md", "## Use it from Python")
    assert DEFAULT_TARGET in block
    out = await run_script(block.replace(DEFAULT_TARGET, srv.target))
    assert out.splitlines() == ["b'hello'", "True"]


async def test_evals_doc_example_runs(srv: RunningServer) -> None:
    block = python_block("docs/evals.md", "```python")
    preamble = 'session_id = "sess-1"\naggregate = {"prompt-v2": {"n": 1, "ok": 1}}\n'
    epilogue = "print(len(runs), len(samples), latest is not None)\n"
    out = await run_script(in_async_main(block.replace(DEFAULT_TARGET, srv.target), preamble, epilogue))
    assert out.split() == ["1", "1", "True"]


async def test_memory_doc_example_runs(srv: RunningServer) -> None:
    block = python_block("docs/memory.md", "```python").replace("import fencepost\n", "")
    epilogue = "print(e.id in [h.id for h in hits.entries])\n"
    out = await run_script(in_async_main(block.replace(DEFAULT_TARGET, srv.target), epilogue=epilogue))
    assert out.split() == ["True"]
