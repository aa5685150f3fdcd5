"""The operator CLI (`fencepost kv|ledger|journal|memory ...`) through a real
server: every subcommand, `--json` parsed and checked, exit codes by reason.

Commands run in-process (`amain` on the test's loop, which also serves the
server); a few run as real processes to check the console entry points."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import fencepost
from fencepost import errors
from fencepost.cli import Exit, amain, exit_code_for
from fencepost_server.storage.sqlite import SqliteStorage
from tests.api.test_serve_process import free_port
from tests.conftest import RunningServer, running


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Result:
    def __init__(self, rc: int, out: str, err: str) -> None:
        self.rc, self.out, self.err = rc, out, err

    def json(self) -> Any:
        return json.loads(self.out)

    def lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines()]


@pytest.fixture
async def srv(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with running(SqliteStorage(tmp_path / "cli.db", synchronous="NORMAL"),
                       ledger_janitor_seconds=0.2, ledger_orphan_grace_seconds=0.2) as s:
        yield s


async def cli(srv: RunningServer | str, *argv: str, stderr: io.StringIO | None = None) -> Result:
    out, err = io.StringIO(), stderr or io.StringIO()
    target = srv if isinstance(srv, str) else srv.target
    rc = await amain([*argv, "--endpoint", target], stdout=out, stderr=err, env={})
    return Result(rc, out.getvalue(), err.getvalue())


async def test_kv_get_put_del_ls_cas(srv: RunningServer) -> None:
    put = await cli(srv, "kv", "put", "app/greeting", "hello", "--json")
    assert put.rc == Exit.OK
    version = put.json()["version"]
    assert put.json() == {"key": "app/greeting", "version": version} and version

    got = await cli(srv, "kv", "get", "app/greeting", "--json")
    assert got.rc == 0 and got.json() == {"key": "app/greeting", "version": version, "value": "hello",
                                          "value_b64": "aGVsbG8="}
    assert (await cli(srv, "kv", "get", "app/greeting")).out == "hello"  # the bytes, no newline added

    assert (await cli(srv, "kv", "put", "app/other", "x")).rc == 0
    listed = await cli(srv, "kv", "ls", "app/", "--json")
    assert listed.rc == 0 and [(e["key"], e["value"]) for e in listed.lines()] == [
        ("app/greeting", "hello"), ("app/other", "x")]
    keys = await cli(srv, "kv", "ls", "app/", "--keys-only", "--limit", "1", "--json")
    assert keys.lines() == [{"key": "app/greeting"}]
    table = await cli(srv, "kv", "ls", "app/")
    assert table.out.splitlines()[0].split() == ["KEY", "VERSION", "BYTES", "VALUE"]
    assert "app/other" in table.out.splitlines()[2]

    # a refused CAS: exit 4, the current version reported, nothing written
    refused = await cli(srv, "kv", "cas", "app/greeting", "new", "--expect", "not-the-version", "--json")
    assert refused.rc == Exit.NOT_APPLIED == 4
    assert refused.json() == {"key": "app/greeting", "applied": False, "version": version}
    assert (await cli(srv, "kv", "cas", "app/greeting", "new", "--absent")).rc == Exit.NOT_APPLIED
    assert (await cli(srv, "kv", "get", "app/greeting")).out == "hello"  # the bytes, no newline added
    applied = await cli(srv, "kv", "cas", "app/greeting", "new", "--expect", version, "--json")
    assert applied.rc == 0 and applied.json()["applied"] is True and applied.json()["version"] != version
    new_version = applied.json()["version"]
    assert (await cli(srv, "kv", "cas", "app/greeting", "--delete", "--expect", version)).rc == Exit.NOT_APPLIED
    assert (await cli(srv, "kv", "cas", "app/greeting", "--delete", "--expect", new_version)).rc == 0

    deleted = await cli(srv, "kv", "del", "app/other", "--json")
    assert deleted.rc == 0 and deleted.json() == {"key": "app/other", "deleted": True}
    assert (await cli(srv, "kv", "del", "app/other")).rc == Exit.NOT_FOUND
    miss = await cli(srv, "kv", "get", "app/other", "--json")
    assert miss.rc == Exit.NOT_FOUND == 3 and miss.out == ""
    assert json.loads(miss.err)["error"]["code"] == "NOT_FOUND"


async def test_binary_values_round_trip_as_base64(srv: RunningServer, tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\x00\x01")
    assert (await cli(srv, "kv", "put", "bin", "--file", str(blob))).rc == 0
    got = (await cli(srv, "kv", "get", "bin", "--json")).json()
    assert got["value"] is None and got["value_b64"] == "/wAB"


async def test_bad_endpoint_is_unavailable_exit_8() -> None:
    res = await cli(f"127.0.0.1:{free_port()}", "kv", "get", "k", "--timeout", "3", "--json")
    assert res.rc == Exit.UNAVAILABLE == 8
    assert json.loads(res.err)["error"]["code"] == "UNAVAILABLE"


async def test_usage_errors_exit_2(srv: RunningServer) -> None:
    assert (await cli(srv, "kv", "cas", "k", "v")).rc == Exit.USAGE  # neither --expect nor --absent
    assert (await cli(srv, "kv", "put", "k")).rc == Exit.USAGE  # no value
    assert (await cli(srv, "ledger", "show")).rc == Exit.USAGE  # no session given
    res = await cli(srv, "kv", "get", "k", "--tls-cert", "/nonexistent.pem")
    assert res.rc == Exit.USAGE and "--tls-key" in res.err


async def test_ledger_deliver_show_inbox_log_sessions(srv: RunningServer) -> None:
    d = await cli(srv, "ledger", "deliver", "agent-1", "--key", "chan-1", "first", "--try-lease", "pod-a",
                  "--ttl", "30", "--dedupe-key", "m-1", "--json")
    assert d.rc == 0
    doc = d.json()
    assert doc["lease_granted"] is True and doc["duplicate"] is False
    assert doc["lease"]["holder_id"] == "pod-a" and doc["lease"]["generation"] >= 1
    sid, gen = doc["session_id"], doc["lease"]["generation"]
    again = (await cli(srv, "ledger", "deliver", "agent-1", "--session", sid, "first", "--dedupe-key", "m-1",
                       "--json")).json()
    assert again["duplicate"] is True and again["inbox_id"] == doc["inbox_id"]
    held = (await cli(srv, "ledger", "deliver", "agent-1", "--key", "chan-1", "second", "--try-lease", "pod-b",
                      "--json")).json()
    assert held["lease_granted"] is False

    shown = await cli(srv, "ledger", "show", "--agent", "agent-1", "--key", "chan-1", "--json")
    assert shown.rc == 0
    head = shown.json()
    assert head["session_id"] == sid and head["pending"] == 2 and head["seq"] == 0
    assert head["lease"]["live"] is True and head["lease"]["generation"] == gen
    assert "holder=pod-a" in (await cli(srv, "ledger", "show", sid)).out

    inbox = await cli(srv, "ledger", "inbox", sid, "--json")
    assert [(e["payload"], e["dedupe_key"]) for e in inbox.lines()] == [("first", "m-1"), ("second", "")]

    async with srv.client() as fp:
        ids = [e["inbox_id"] for e in inbox.lines()]
        await fp.commit(sid, gen, 0, [b"turn-1", b"\xfe"], consume=ids)
    log = await cli(srv, "ledger", "log", sid, "--json")
    assert log.rc == 0 and [(r["seq"], r["data"], r["data_b64"]) for r in log.lines()] == [
        (1, "turn-1", "dHVybi0x"), (2, None, "/g==")]
    assert [r["seq"] for r in (await cli(srv, "ledger", "log", sid, "--from", "2", "--json")).lines()] == [2]
    assert "turn-1" in (await cli(srv, "ledger", "log", sid)).out

    sessions = await cli(srv, "ledger", "sessions", "agent-1", "--json")
    assert [(s["session_id"], s["session_key"], s["seq"]) for s in sessions.lines()] == [(sid, "chan-1", 2)]
    assert sid in (await cli(srv, "ledger", "sessions", "agent-1")).out

    missing = await cli(srv, "ledger", "show", "no-such-session", "--json")
    assert missing.rc == Exit.NOT_FOUND
    assert json.loads(missing.err)["error"]["reason"] == "SESSION_NOT_FOUND"


async def test_ledger_claim_an_orphan_and_nothing_to_claim(srv: RunningServer) -> None:
    none = await cli(srv, "ledger", "claim", "rescuer", "--json")
    assert none.rc == Exit.NOT_FOUND and none.out == ""
    # a holder that took the lease and died (no renew) with an event pending
    d = (await cli(srv, "ledger", "deliver", "agent-2", "--key", "k", "orphaned", "--try-lease", "dead",
                   "--ttl", "0.2", "--json")).json()
    claimed = await cli(srv, "ledger", "claim", "rescuer", "--agent", "agent-2", "--wait", "20", "--json")
    assert claimed.rc == 0
    doc = claimed.json()
    assert doc["session_id"] == d["session_id"] and doc["pending"] == 1
    assert doc["lease"]["holder_id"] == "rescuer" and doc["lease"]["generation"] > d["lease"]["generation"]


async def test_log_progress_only_on_a_terminal(srv: RunningServer) -> None:
    async with srv.client() as fp:
        sid = (await fp.open_session("agent-p", "k")).session_id
        lease = await fp.acquire_lease(sid, "w", ttl=30)
        await fp.commit(sid, lease.generation, 0, [b"r%d" % i for i in range(5)])
    tty = Tty()
    res = await cli(srv, "ledger", "log", sid, "--json", stderr=tty)
    assert len(res.lines()) == 5
    assert "reading log: " in tty.getvalue() and "/5 records" in tty.getvalue()
    plain = await cli(srv, "ledger", "log", sid, "--json")
    assert plain.err == "" and len(plain.lines()) == 5
    quiet = Tty()
    await cli(srv, "ledger", "log", sid, "--no-progress", stderr=quiet)
    assert quiet.getvalue() == ""


async def test_journal_append_and_read(srv: RunningServer) -> None:
    rec = {"at": "2025-01-01T00:00:00Z", "sessionId": "s-1", "channelId": "c-1", "status": "completed",
           "title": "first turn", "newField": {"kept": True}}
    a = await cli(srv, "journal", "append", "agent-j", json.dumps(rec), "--json")
    assert a.rc == 0 and a.json()["agent"] == "agent-j" and a.json()["record_id"]
    b = await cli(srv, "journal", "append", "agent-j", "--session", "s-2", "--channel", "c-1", "--status",
                  "failed", "--title", "second")
    assert b.rc == 0 and b.out.strip()

    tty = Tty()
    read = await cli(srv, "journal", "read", "agent-j", "--json", stderr=tty)
    assert read.rc == 0
    records = read.lines()
    assert records[0] == rec
    assert (records[1]["sessionId"], records[1]["status"], records[1]["title"]) == ("s-2", "failed", "second")
    assert records[1]["at"]  # filled in with now
    assert "reading journal: " in tty.getvalue()
    table = await cli(srv, "journal", "read", "agent-j")
    assert table.out.splitlines()[0].split() == ["AT", "SESSION", "STATUS", "TITLE", "USER", "MESSAGE"]
    assert "first turn" in table.out
    raw = await cli(srv, "journal", "read", "agent-j", "--raw")
    assert [json.loads(line) for line in raw.out.splitlines()] == records

    assert (await cli(srv, "journal", "read", "nobody")).rc == Exit.NOT_FOUND
    bad = await cli(srv, "journal", "append", "a/b", "--session", "s", "--channel", "c", "--json")
    assert bad.rc == Exit.INVALID == 6
    assert json.loads(bad.err)["error"]["reason"] == "AGENT_NAME_INVALID"
    assert (await cli(srv, "journal", "append", "agent-j", "not json")).rc == Exit.USAGE


async def test_memory_list_search_pin_topics(srv: RunningServer) -> None:
    async with srv.client() as fp:
        a = await fp.memory_append("agent-m", "The deploy uses Postgres", kind="semantic",
                                   about=["Deploy pipeline"])
        b = await fp.memory_append("agent-m", "deploy window is friday")
    listed = await cli(srv, "memory", "list", "agent-m", "--json")
    assert listed.rc == 0
    assert [(e["id"], e["content"]) for e in listed.lines()] == [(a.id, a.content), (b.id, b.content)]
    assert (await cli(srv, "memory", "list", "agent-m", "--limit", "1", "--json")).lines()[0]["id"] == a.id
    assert a.id in (await cli(srv, "memory", "list", "agent-m")).out

    found = await cli(srv, "memory", "search", "agent-m", "postgres", "--json")
    assert found.rc == 0 and [e["id"] for e in found.json()["entries"]] == [a.id]
    assert found.json()["strategy"] == "recency"
    ranked = await cli(srv, "memory", "search", "agent-m", "deploy", "--strategy", "relevance", "--json")
    assert ranked.json()["strategy"] == "relevance" and len(ranked.json()["entries"]) == 2
    assert "Postgres" in (await cli(srv, "memory", "search", "agent-m", "postgres")).out

    pinned = await cli(srv, "memory", "pin", "agent-m", a.id, "--json")
    assert pinned.rc == 0 and pinned.json()["pinned"] is True and pinned.json()["bytes"] > 0
    async with srv.client() as fp:
        big = await fp.memory_append("agent-m", "y" * 2100)
    refused = await cli(srv, "memory", "pin", "agent-m", big.id, "--json")
    assert refused.rc == Exit.NOT_APPLIED and refused.json()["pinned"] is False and refused.json()["reason"]
    assert (await cli(srv, "memory", "pin", "agent-m", "no-such-entry")).rc == Exit.NOT_FOUND

    listing = await cli(srv, "memory", "pinned", "agent-m", "--json")
    assert [e["id"] for e in listing.json()["entries"]] == [a.id] and listing.json()["allocated_bytes"] > 0
    assert a.id in (await cli(srv, "memory", "pinned", "agent-m")).out
    assert (await cli(srv, "memory", "unpin", "agent-m", a.id, "--json")).json()["unpinned"] is True
    assert (await cli(srv, "memory", "unpin", "agent-m", a.id)).rc == Exit.NOT_APPLIED
    assert (await cli(srv, "memory", "pinned", "agent-m", "--json")).json()["entries"] == []
    forgot = await cli(srv, "memory", "forget", "agent-m", b.id, "--json")
    assert forgot.rc == 0 and forgot.json()["forgotten"] is True
    assert (await cli(srv, "memory", "forget", "agent-m", b.id)).rc == Exit.NOT_FOUND
    assert b.id not in [e["id"] for e in (await cli(srv, "memory", "list", "agent-m", "--json")).lines()]

    topics = await cli(srv, "memory", "topics", "agent-m", "--json")
    assert topics.rc == 0
    assert {t["name"]: t["count"] for t in topics.json()["topics"]} == {"Deploy pipeline": 1}
    assert "Deploy pipeline" in (await cli(srv, "memory", "topics", "agent-m")).out


async def test_journal_archives(tmp_path: Path) -> None:
    async with running(SqliteStorage(tmp_path / "rot.db", synchronous="NORMAL"), max_journal_bytes=1500) as srv:
        for i in range(30):
            assert (await cli(srv, "journal", "append", "agent-r", "--session", "s", "--channel", "c",
                              "--title", f"turn {i:02d}")).rc == 0
        assert (await cli(srv, "journal", "read", "agent-r")).rc == 0  # flush-on-read rotates
        archives = (await cli(srv, "journal", "archives", "agent-r", "--json")).lines()
        assert len(archives) >= 2 and all(0 < a["size_bytes"] <= 1500 for a in archives)
        assert all(a["rotate_time"].endswith("Z") for a in archives)
        first = await cli(srv, "journal", "read", "agent-r", "--archive", archives[0]["name"], "--json")
        assert len(first.lines()) == archives[0]["record_count"] and first.lines()[0]["title"] == "turn 00"
        table = await cli(srv, "journal", "archives", "agent-r")
        assert table.out.splitlines()[0].split() == ["NAME", "BYTES", "RECORDS", "ROTATED"]
        assert (await cli(srv, "journal", "archives", "nobody", "--json")).lines() == []


def test_exit_codes_by_status() -> None:
    expected = {
        errors.SessionNotFound: Exit.NOT_FOUND, errors.LeaseHeld: Exit.PRECONDITION,
        errors.LeaseFenced: Exit.PRECONDITION, errors.InboxNotEmpty: Exit.PRECONDITION,
        errors.TxnContended: Exit.PRECONDITION, errors.KeyInvalid: Exit.INVALID,
        errors.MessageTooLarge: Exit.INVALID, errors.Unauthenticated: Exit.DENIED,
        errors.PermissionDenied: Exit.DENIED, errors.BackendUnavailable: Exit.UNAVAILABLE,
        errors.DeadlineExceeded: Exit.UNAVAILABLE, errors.Internal: Exit.ERROR,
    }
    for cls, code in expected.items():
        assert exit_code_for(cls("x")) == code, cls
    assert len({Exit.OK, Exit.ERROR, Exit.USAGE, Exit.NOT_FOUND, Exit.NOT_APPLIED, Exit.PRECONDITION,
                Exit.INVALID, Exit.DENIED, Exit.UNAVAILABLE}) == 9


async def _proc(*argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_console_entry_points_as_processes(srv: RunningServer) -> None:
    ep = ["--endpoint", srv.target]
    # `python -m fencepost` (client-only install), value from stdin
    rc, out, _ = await _proc("-m", "fencepost", "kv", "put", "p/k", "-", *ep, "--json", stdin=b"from stdin")
    assert rc == 0
    version = json.loads(out)["version"]
    # the `fencepost` command (server package) carries the same subcommands
    rc, out, _ = await _proc("-m", "fencepost_server", "kv", "get", "p/k", *ep, "--json")
    assert rc == 0 and json.loads(out)["value"] == "from stdin"
    rc, _, _ = await _proc("-m", "fencepost", "kv", "put", "p/f", "--file", "-", *ep, stdin=b"\x00\xffbinary")
    assert rc == 0
    rc, out, _ = await _proc("-m", "fencepost", "kv", "get", "p/f", *ep, "--json")
    assert rc == 0 and json.loads(out)["value_b64"] == "AP9iaW5hcnk="
    rc, out, _ = await _proc("-m", "fencepost_server", "kv", "cas", "p/k", "v2", "--expect", version + "0", *ep)
    assert rc == Exit.NOT_APPLIED and "not applied" in out
    rc, _, err = await _proc("-m", "fencepost", "kv", "get", "p/k", "--endpoint", f"127.0.0.1:{free_port()}")
    assert rc == Exit.UNAVAILABLE and "UNAVAILABLE" in err
    rc, _, _ = await _proc("-m", "fencepost", "kv", "frobnicate")
    assert rc == Exit.USAGE


async def test_token_from_the_environment_is_sent(srv: RunningServer) -> None:
    # no auth configured: the token is accepted and ignored; a malformed one is still a header
    out = io.StringIO()
    rc = await amain(["kv", "put", "t", "v"], stdout=out, stderr=io.StringIO(),
                     env={"FENCEPOST_ENDPOINT": srv.target, "FENCEPOST_TOKEN": "secret"})
    assert rc == 0 and out.getvalue().strip()
    async with fencepost.AsyncClient(srv.target) as fp:
        assert (await fp.get("t")) is not None


async def test_tls_flags_token_and_denied_exit_7(tmp_path: Path) -> None:
    from fencepost_server.app import App
    from fencepost_server.config import Settings
    from fencepost_server.storage.memory import MemoryStorage
    from tests.api.security_support import make_pki, write_tokens

    pki = make_pki()
    files = {"ca.pem": pki.ca_pem, "server.pem": pki.server_cert, "server.key": pki.server_key}
    cert, key = pki.client(None)
    files |= {"client.pem": cert, "client.key": key}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    app = App(Settings(listen="127.0.0.1:0", tls_cert=tmp_path / "server.pem", tls_key=tmp_path / "server.key",
                       tls_client_ca=tmp_path / "ca.pem", tokens_file=write_tokens(tmp_path / "tokens.json")),
              storage=MemoryStorage())
    await app.start()
    try:
        target = f"127.0.0.1:{app.port}"
        tls = ["--tls-ca", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "client.pem"),
               "--tls-key", str(tmp_path / "client.key"), "--tls-server-name", "localhost", "--timeout", "5"]
        ok = await cli(target, "kv", "put", "k", "v", *tls, "--token", "token-tenant-a", "--json")
        assert ok.rc == 0 and ok.json()["version"]
        out = io.StringIO()
        rc = await amain(["kv", "get", "k", *tls], stdout=out, stderr=io.StringIO(),
                         env={"FENCEPOST_ENDPOINT": target, "FENCEPOST_TOKEN": "token-tenant-a"})
        assert rc == 0 and out.getvalue() == "v"
        # the same TLS settings from the environment alone (the SDK's variables)
        out = io.StringIO()
        tls_env = {"FENCEPOST_ENDPOINT": target, "FENCEPOST_TOKEN": "token-tenant-a",
                   "FENCEPOST_TLS_CA": str(tmp_path / "ca.pem"), "FENCEPOST_TLS_CERT": str(tmp_path / "client.pem"),
                   "FENCEPOST_TLS_KEY": str(tmp_path / "client.key"), "FENCEPOST_TLS_SERVER_NAME": "localhost"}
        rc = await amain(["kv", "get", "k"], stdout=out, stderr=io.StringIO(), env=tls_env)
        assert rc == 0 and out.getvalue() == "v"
        async with fencepost.AsyncClient(env=tls_env) as fp:
            assert (await fp.get("k")).value == b"v"  # type: ignore[union-attr]
        denied = await cli(target, "kv", "get", "k", *tls, "--token", "wrong", "--json")
        assert denied.rc == Exit.DENIED == 7
        assert json.loads(denied.err)["error"]["code"] == "UNAUTHENTICATED"
        plaintext = await cli(target, "kv", "get", "k", "--token", "token-tenant-a", "--timeout", "3")
        assert plaintext.rc == Exit.UNAVAILABLE
    finally:
        await app.stop(grace=0.2)


def test_the_client_cli_imports_no_server_code() -> None:
    import subprocess

    code = ("import sys, fencepost.cli, fencepost.mirror, fencepost.worker; "
            "bad = sorted(m for m in sys.modules if m.startswith('fencepost_server')); "
            "assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


async def test_ledger_delete(srv: RunningServer) -> None:
    d = (await cli(srv, "ledger", "deliver", "agent-3", "--key", "gone", "event", "--json")).json()
    refused = await cli(srv, "ledger", "delete", d["session_id"], "--json")
    assert refused.rc == Exit.PRECONDITION and json.loads(refused.err)["error"]["reason"] == "INBOX_NOT_EMPTY"
    done = await cli(srv, "ledger", "delete", "--agent", "agent-3", "--key", "gone", "--force", "--json")
    assert done.rc == 0 and done.json()["deleted_session_ids"] == [d["session_id"]]
    assert done.json()["erased_items"] >= 1
    assert (await cli(srv, "ledger", "show", d["session_id"])).rc == Exit.NOT_FOUND
