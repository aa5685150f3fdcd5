"""What a new operator meets first: bytes that survive `kv put` / `kv get`
exactly, memory written from the shell, the SDK finding the server through
the same environment as the CLI, and the README's holder loop as written."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import fencepost
from fencepost.cli import Exit, amain
from fencepost_server.domain.limits import Limits
from fencepost_server.storage.memory import MemoryStorage
from tests.conftest import RunningServer, running

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def srv() -> AsyncIterator[RunningServer]:
    # values up to 2 MiB (the default limit is 256 KiB) for the 1 MiB round trip
    async with running(MemoryStorage(), limits=Limits(max_value_bytes=2 * 1024 * 1024)) as s:
        yield s


def client_env(target: str) -> dict[str, str]:
    """The test's environment with only FENCEPOST_ENDPOINT of fencepost's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    return {**env, "FENCEPOST_ENDPOINT": target}


async def run(*argv: str, env: dict[str, str], stdout: int | None = asyncio.subprocess.PIPE
              ) -> tuple[int, bytes, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fencepost", *argv, stdout=stdout, stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out or b"", err.decode()


async def cli(srv: RunningServer, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = await amain([*argv, "--endpoint", srv.target], stdout=out, stderr=err, env={})
    return rc, out.getvalue(), err.getvalue()


async def test_a_binary_mebibyte_round_trips_byte_for_byte(srv: RunningServer, tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(1024 * 1024 - 7) + b"\x00\xff\xfe\r\n\x80\n")  # never valid UTF-8 throughout
    env = client_env(srv.target)
    rc, _, err = await run("kv", "put", "blobs/one", "--file", str(blob), env=env)
    assert rc == 0, err

    # stdout redirected to a file, as `fencepost kv get k > out.bin`
    redirected = tmp_path / "redirected.bin"
    with redirected.open("wb") as sink:
        rc, _, err = await run("kv", "get", "blobs/one", env=env, stdout=sink.fileno())
    assert rc == 0 and err == ""
    assert redirected.read_bytes() == blob.read_bytes()

    # --out FILE
    written = tmp_path / "written.bin"
    rc, out, err = await run("kv", "get", "blobs/one", "--out", str(written), env=env)
    assert rc == 0 and out == b"" and err == ""
    assert written.read_bytes() == blob.read_bytes()

    # only --json encodes, and says how: UTF-8 text (null here) and base64
    rc, out, _ = await run("kv", "get", "blobs/one", "--json", env=env)
    doc = json.loads(out)
    assert rc == 0 and doc["value"] is None
    assert base64.b64decode(doc["value_b64"]) == blob.read_bytes()


async def test_kv_get_prints_text_without_adding_a_newline(srv: RunningServer) -> None:
    assert (await cli(srv, "kv", "put", "k", "line one\nline two"))[0] == 0
    rc, out, _ = await cli(srv, "kv", "get", "k")
    assert rc == 0 and out == "line one\nline two"


async def test_memory_append_pin_forget_from_the_cli(srv: RunningServer) -> None:
    rc, out, err = await cli(srv, "memory", "append", "agent-m", "deploys happen on tuesdays",
                             "--kind", "semantic", "--about", "deploys", "--metadata", '{"source": "ops"}', "--json")
    assert rc == 0, err
    entry = json.loads(out)
    assert entry["content"] == "deploys happen on tuesdays" and entry["about"] == ["deploys"]
    assert entry["kind"] == "MEMORY_KIND_SEMANTIC" and entry["metadata"] == {"source": "ops"}
    rc, plain_id, _ = await cli(srv, "memory", "append", "agent-m", "the build needs 4 GiB")
    assert rc == 0 and plain_id.strip()

    rc, out, _ = await cli(srv, "memory", "search", "agent-m", "deploys", "--json")
    assert rc == 0 and [e["id"] for e in json.loads(out)["entries"]] == [entry["id"]]
    assert (await cli(srv, "memory", "pin", "agent-m", entry["id"]))[0] == 0
    rc, out, _ = await cli(srv, "memory", "pinned", "agent-m", "--json")
    assert [e["id"] for e in json.loads(out)["entries"]] == [entry["id"]]
    assert (await cli(srv, "memory", "forget", "agent-m", plain_id.strip()))[0] == 0
    rc, out, _ = await cli(srv, "memory", "list", "agent-m", "--json")
    assert [json.loads(line)["id"] for line in out.splitlines()] == [entry["id"]]

    # mistakes are usage errors, caught before any call
    assert (await cli(srv, "memory", "append", "agent-m", "x", "--metadata", "[1]"))[0] == Exit.USAGE
    assert (await cli(srv, "memory", "append", "agent-m", "x", "--valid-from", "tuesday"))[0] == Exit.USAGE


async def test_ledger_show_of_a_never_leased_session(srv: RunningServer) -> None:
    async with srv.client() as fp:
        info = await fp.open_session("agent-l", "chan-1")
    rc, out, _ = await cli(srv, "ledger", "show", info.session_id)
    assert rc == 0
    lease_line = next(line for line in out.splitlines() if line.startswith("lease"))
    assert "never leased" in lease_line and "released" not in lease_line


async def test_journal_read_leaves_title_empty_when_a_record_has_none(srv: RunningServer) -> None:
    record = {"sessionId": "s-1", "channelId": "c-1", "status": "completed", "userMessage": "please deploy"}
    assert (await cli(srv, "journal", "append", "agent-j", json.dumps(record)))[0] == 0
    rc, out, _ = await cli(srv, "journal", "read", "agent-j")
    assert rc == 0
    header, row = out.splitlines()[:2]
    title_at, message_at = header.index("TITLE"), header.index("USER MESSAGE")
    assert row[title_at:message_at].strip() == "-"
    assert row[message_at:].strip() == "please deploy"


async def test_sdk_defaults_come_from_the_environment(srv: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCEPOST_ENDPOINT", srv.target)
    monkeypatch.setenv("FENCEPOST_TOKEN", "from-env")
    async with fencepost.AsyncClient() as fp:
        await fp.put("env/k", b"v")
        assert ("authorization", "Bearer from-env") in fp._caller.metadata
    async with fencepost.AsyncClient(token="explicit") as fp:  # explicit arguments win
        assert ("authorization", "Bearer explicit") in fp._caller.metadata
    async with fencepost.AsyncClient(token="") as fp:  # "" sends none whatever the environment says
        assert not [k for k, _ in fp._caller.metadata if k == "authorization"]
    # a TLS variable turns TLS on: a plaintext server then refuses the handshake
    monkeypatch.setenv("FENCEPOST_TLS_CA", str(ROOT / "no-such-ca.pem"))
    with pytest.raises(ValueError, match="cannot read a TLS file"):
        fencepost.AsyncClient()
    monkeypatch.delenv("FENCEPOST_TLS_CA")
    monkeypatch.setenv("FENCEPOST_ENDPOINT", "127.0.0.1:1")
    async with fencepost.AsyncClient(srv.target) as fp:  # an explicit target wins
        assert (await fp.get("env/k")) is not None


def readme_holder_loop() -> str:
    readme = (ROOT / "README.md").read_text()
    intro = readme.index("A holder's loop with the Python SDK")
    match = re.search(r"```python\n(.*?)```", readme[intro:], re.S)
    assert match, "the README's holder loop example is gone"
    return match.group(1)


async def test_readme_holder_loop_runs_with_only_the_endpoint_in_the_environment(srv: RunningServer) -> None:
    assert not srv.target.endswith(":50051")
    body = "".join(f"    {line}\n" for line in readme_holder_loop().splitlines())
    script = f"import asyncio\nimport fencepost\n\nasync def main():\n{body}\nasyncio.run(main())\n"
    async with srv.client() as fp:
        session = await fp.open_session("support-agent", "channel-C0123")
        await fp.deliver(b"hello", session_id=session.session_id)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, env=client_env(srv.target),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            for _ in range(600):  # the loop commits the parked event, then waits for more
                records = [r async for r in fp.read_log(session.session_id)]
                if records or proc.returncode is not None:
                    break
                await asyncio.sleep(0.1)
            assert proc.returncode is None, (await proc.communicate())[1].decode()
            assert [r.data for r in records] == [b"turn record"]
            assert (await fp.get_session(session.session_id)).pending == 0
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            await proc.wait()


@pytest.mark.parametrize("token", ["tok\r", "tok\n", "tök"], ids=["cr", "newline", "non-ascii"])
async def test_a_token_no_header_can_carry_is_a_usage_error(srv: RunningServer, token: str) -> None:
    # a line end kept from a token file used to escape from inside gRPC's call
    # batch: a traceback from `fencepostctl`, "unexpected ExecuteBatchError" elsewhere
    rc, out, err = await run("kv", "get", "k", env={**client_env(srv.target), "FENCEPOST_TOKEN": token})
    assert rc == Exit.USAGE and out == b"", err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("fencepost: ") and "FENCEPOST_TOKEN" in err and "printable ASCII" in err
    with pytest.raises(ValueError, match="printable ASCII"):
        fencepost.AsyncClient(srv.target, token=token)


async def test_readme_memory_search_finds_what_the_readme_appended(srv: RunningServer) -> None:
    # the README searched "deploy" for "deploys happen on tuesdays": whole-word
    # matching found nothing, so the example showed an empty table
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Operate it"):]
    lines = {argv[2]: argv[2:] for argv in (
        shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("fencepost memory "))}
    rc, out, err = await cli(srv, "memory", *lines["append"])
    assert rc == 0, err
    entry_id = out.strip()
    rc, out, err = await cli(srv, "memory", *lines["search"], "--json")
    assert rc == 0, err
    assert [e["id"] for e in json.loads(out)["entries"]] == [entry_id]


def test_a_sync_client_refused_at_construction_leaves_no_thread_behind() -> None:
    import threading

    def loops() -> int:
        return sum(t.name == "fencepost-client" for t in threading.enumerate())

    before = loops()
    for _ in range(3):
        with pytest.raises(ValueError):
            fencepost.Client("127.0.0.1:1", token="tok\n")
    assert loops() == before


async def test_a_reader_closing_the_pipe_early_gets_no_error_line(srv: RunningServer) -> None:
    # `fencepost kv ls --json | head -1` printed "fencepost: [Errno 32] Broken pipe"
    async with srv.client() as fp:
        await asyncio.gather(*(fp.put(f"pipe/{i:04d}", os.urandom(2048)) for i in range(200)))

    def head_1() -> tuple[bytes, str, int]:  # as `| head -1`: read a line, then close the pipe
        proc = subprocess.Popen([sys.executable, "-m", "fencepost", "kv", "ls", "pipe/", "--json"],
                                env=client_env(srv.target), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        return first, err, proc.wait(60)

    first, err, rc = await asyncio.to_thread(head_1)
    assert json.loads(first)["key"] == "pipe/0000"
    assert err == "" and rc == Exit.ERROR


@pytest.mark.parametrize("flags", [
    pytest.param(("--tls-ca", "{garbage}"), id="ca-not-pem"),
    pytest.param(("--tls-cert", "{garbage}", "--tls-key", "{garbage}"), id="client-pair-not-pem"),
])
async def test_client_tls_files_that_do_not_parse_are_a_usage_error(
    srv: RunningServer, tmp_path: Path, flags: tuple[str, ...]
) -> None:
    # gRPC found these only at the handshake: core log lines, then UNAVAILABLE
    # (exit 8), as if the server were down
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    argv = [f.format(garbage=garbage) for f in flags]
    rc, out, err = await run("kv", "get", "k", *argv, "--timeout", "5", env=client_env(srv.target))
    assert rc == Exit.USAGE and out == b"", err
    assert len(err.splitlines()) == 1 and "PEM" in err and str(garbage) in err, err
    with pytest.raises(ValueError, match="PEM"):
        fencepost.AsyncClient(srv.target, env={"FENCEPOST_TLS_CA": str(garbage)})
