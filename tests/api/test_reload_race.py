"""A SIGHUP that reaches `fencepost serve` while it is still starting (the
backend probe can take seconds) reloads the identity files: it neither kills
the process (SIGHUP's default action) nor is lost, which would leave a token
revoked by that edit working until the next SIGHUP."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencepost
from tests.api.security_support import write_tokens
from tests.api.test_serve_process import free_port

@contextlib.contextmanager
def _serving(script: str, tokens: Path, port: int) -> Iterator[subprocess.Popen[str]]:
    """Runs `script` (argv: tokens file, port) until its "serving" line; ends
    it with SIGTERM, which it must answer with exit 0."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tokens), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=Path(__file__).parents[2],
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "fencepost serving on" in line, (line, proc.wait(timeout=30), proc.stderr.read() if proc.stderr else "")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0


#: runs `fencepost serve`, with App.start patched to revoke the old token and
#: send the reload signal before the server binds (what a deploy tool that
#: edits the file and sends SIGHUP during start-up does)
_SERVE_WITH_EDIT_DURING_START = """
import asyncio, os, signal, sys
from fencepost_server import app, cli
from tests.api.security_support import write_tokens

original = app.App.start
tokens = sys.argv[1]

async def start(self):
    write_tokens(__import__("pathlib").Path(tokens), {"new-token": ("a", "service")})
    os.kill(os.getpid(), signal.SIGHUP)
    await asyncio.sleep(0.2)  # the signal is delivered and handled (or kills us) here
    return await original(self)

app.App.start = start
sys.exit(cli.main(["serve", "--listen", "127.0.0.1:" + sys.argv[2], "--backend", "memory://",
                   "--tokens-file", tokens]))
"""


def test_sighup_during_start_up_reloads_and_does_not_kill(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.json", {"old-token": ("a", "service")})
    port = free_port()
    with _serving(_SERVE_WITH_EDIT_DURING_START, tokens, port):
        with fencepost.Client(f"127.0.0.1:{port}", token="new-token", timeout=10) as fp:
            fp.put("k", b"v")
        with fencepost.Client(f"127.0.0.1:{port}", token="old-token", timeout=10) as fp:
            with pytest.raises(fencepost.FencepostError):
                fp.put("k", b"v")


#: runs `fencepost serve`, with the configuration check (which reads the
#: tokens file) sending the reload signal: the earliest moment of start-up
_SERVE_WITH_SIGHUP_DURING_CHECKS = """
import os, signal, sys
from fencepost_server import cli

original = cli.check_config

def check_config(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGHUP)
    return original(*args, **kwargs)

cli.check_config = check_config
sys.exit(cli.main(["serve", "--listen", "127.0.0.1:" + sys.argv[2], "--backend", "memory://",
                   "--tokens-file", sys.argv[1]]))
"""


def test_sighup_during_the_configuration_checks_does_not_kill(tmp_path: Path) -> None:
    """The checks before start-up read the tokens file too: a SIGHUP then
    (a deploy tool's edit) killed the server, SIGHUP's default action."""
    tokens = write_tokens(tmp_path / "tokens.json", {"a-token": ("a", "service")})
    with _serving(_SERVE_WITH_SIGHUP_DURING_CHECKS, tokens, free_port()):
        pass  # it came up serving, and a SIGTERM then ends it with 0


class _FakeProc:
    def __init__(self) -> None:
        self.signals: list[int] = []
        self.stdout = None

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)


def test_supervisor_sends_a_reload_to_a_starting_worker_once_it_serves() -> None:
    """`--workers N`: a worker still starting is not sent SIGHUP (it could kill
    it) but is owed one, sent when its "serving" line arrives."""
    import time

    from fencepost_server.config import Settings
    from fencepost_server.workers import READY_LINE, Supervisor, _Worker

    sup = Supervisor(Settings(), 2, False)
    ready = _Worker(0, _FakeProc(), time.monotonic(), ready=True)  # type: ignore[arg-type]
    starting = _Worker(1, _FakeProc(), time.monotonic())  # type: ignore[arg-type]
    sup.workers = {0: ready, 1: starting}
    read_end, write_end = os.pipe()
    try:
        sup._selector.register(read_end, __import__("selectors").EVENT_READ, starting)
        sup._on_reload(signal.SIGHUP, None)
        assert ready.proc.signals == [signal.SIGHUP]
        assert starting.proc.signals == []  # not yet: its handler may not exist
        os.write(write_end, READY_LINE + b" 127.0.0.1:1\n")
        sup._pump(1.0)
        assert starting.ready and starting.proc.signals == [signal.SIGHUP]
        os.write(write_end, READY_LINE + b" again\n")
        sup._pump(1.0)
        assert starting.proc.signals == [signal.SIGHUP]  # owed once, paid once
    finally:
        sup._selector.close()
        os.close(read_end)
        os.close(write_end)


async def test_an_open_stream_stops_delivering_once_its_token_is_revoked(tmp_path: Path) -> None:
    """A server stream authenticated its caller once, at its start: a
    WatchInbox opened with a token kept receiving the tenant's new events
    after SIGHUP revoked that token, for as long as the session stayed held."""
    import asyncio

    from fencepost import errors
    from fencepost_server.app import App
    from fencepost_server.config import Settings
    from fencepost_server.storage.memory import MemoryStorage

    tokens = write_tokens(tmp_path / "tokens.json", {"watcher": ("a", "service"), "sender": ("a", "service")})
    app = App(Settings(listen="127.0.0.1:0", tokens_file=tokens), storage=MemoryStorage())
    await app.start()
    try:
        target = f"127.0.0.1:{app.port}"
        async with fencepost.AsyncClient(target, token="watcher", retry=fencepost.NO_RETRY, timeout=30) as watcher, \
                fencepost.AsyncClient(target, token="sender", retry=fencepost.NO_RETRY, timeout=30) as sender:
            sid = (await sender.open_session("agent", "s")).session_id
            lease = await sender.acquire_lease(sid, "A", ttl=60)
            await sender.deliver(b"before", session_id=sid)
            seen: list[bytes] = []

            async def watch() -> None:
                async for event in watcher.watch_inbox(sid, lease.generation):
                    seen.append(event.payload)

            task = asyncio.create_task(watch())
            while not seen:
                await asyncio.sleep(0.01)
            write_tokens(tokens, {"sender": ("a", "service")})  # "watcher" revoked
            app.reload_identities()
            await sender.deliver(b"after", session_id=sid)
            with pytest.raises(errors.Unauthenticated):
                await asyncio.wait_for(task, 10)
            assert seen == [b"before"]
    finally:
        await app.stop(grace=0.2)


async def test_a_waiting_claim_grants_nothing_once_its_token_is_revoked(tmp_path: Path) -> None:
    """ClaimOrphan waits up to 60 s for an orphan: a claim that started with a
    token revoked while it waited used to be granted the next orphan, so the
    session stayed held by a worker that could no longer renew (or commit)
    until the lease ran out, and its contents went to the revoked caller."""
    import asyncio

    from fencepost import errors
    from fencepost_server.app import App
    from fencepost_server.config import Settings
    from fencepost_server.storage.memory import MemoryStorage

    tokens = write_tokens(tmp_path / "tokens.json", {"claimer": ("a", "service"), "owner": ("a", "service")})
    settings = Settings(listen="127.0.0.1:0", tokens_file=tokens, ledger_janitor_seconds=0.05,
                        ledger_orphan_grace_seconds=0.1)
    app = App(settings, storage=MemoryStorage())
    await app.start()
    try:
        target = f"127.0.0.1:{app.port}"
        async with fencepost.AsyncClient(target, token="claimer", retry=fencepost.NO_RETRY, timeout=30) as claimer, \
                fencepost.AsyncClient(target, token="owner", retry=fencepost.NO_RETRY, timeout=30) as owner:
            sid = (await owner.open_session("agent", "s")).session_id
            claim = asyncio.create_task(claimer.claim_orphan("revoked-worker", ttl=60, wait=20))
            await asyncio.sleep(0.3)  # the claim is waiting
            assert not claim.done()
            write_tokens(tokens, {"owner": ("a", "service")})  # "claimer" revoked
            app.reload_identities()
            dead = await owner.acquire_lease(sid, "dies", ttl=0.2)  # and walks away: an orphan
            await owner.deliver(b"work", session_id=sid)  # with work pending
            with pytest.raises(errors.Unauthenticated):
                await asyncio.wait_for(claim, 15)
            # the orphan was not granted to the revoked caller: a live worker gets it
            rescued = await owner.claim_orphan("rescuer", ttl=30, wait=10)
            assert rescued is not None and rescued.session_id == sid
            assert rescued.lease.holder_id == "rescuer" and rescued.lease.generation == dead.generation + 1
    finally:
        await app.stop(grace=0.2)


async def test_a_waiting_claim_ends_when_its_token_is_revoked(tmp_path: Path) -> None:
    """A reload wakes waiting ClaimOrphan calls: a revoked caller's claim
    ends with UNAUTHENTICATED at once instead of holding its call open for
    the rest of its wait (up to 60 s) until an orphan or the end of it."""
    import asyncio

    from fencepost import errors
    from fencepost_server.app import App
    from fencepost_server.config import Settings
    from fencepost_server.storage.memory import MemoryStorage

    tokens = write_tokens(tmp_path / "tokens.json", {"claimer": ("a", "service"), "kept": ("a", "service")})
    app = App(Settings(listen="127.0.0.1:0", tokens_file=tokens), storage=MemoryStorage())
    await app.start()
    try:
        target = f"127.0.0.1:{app.port}"
        async with fencepost.AsyncClient(target, token="claimer", retry=fencepost.NO_RETRY, timeout=60) as claimer, \
                fencepost.AsyncClient(target, token="kept", retry=fencepost.NO_RETRY, timeout=60) as kept:
            revoked = asyncio.create_task(claimer.claim_orphan("revoked-worker", ttl=60, wait=50))
            waiting = asyncio.create_task(kept.claim_orphan("live-worker", ttl=60, wait=1.5))
            await asyncio.sleep(0.3)  # both claims are waiting
            assert not revoked.done() and not waiting.done()
            write_tokens(tokens, {"kept": ("a", "service")})  # "claimer" revoked
            app.reload_identities()
            with pytest.raises(errors.Unauthenticated):
                await asyncio.wait_for(revoked, 10)
            assert await waiting is None  # a caller still allowed waits on, undisturbed
    finally:
        await app.stop(grace=0.2)


async def test_an_idle_watch_ends_once_its_token_is_revoked(tmp_path: Path) -> None:
    """WatchInbox and WatchDue identified their caller again only before
    sending something: a watch with nothing to send kept running (and
    polling the backend) for as long as the session stayed held, long after
    a reload revoked its token. The reload wakes them, as it wakes a
    waiting ClaimOrphan, and a revoked caller's watch ends at once; a
    caller still allowed watches on."""
    import asyncio

    from fencepost import errors
    from fencepost_server.app import App
    from fencepost_server.config import Settings
    from fencepost_server.storage.memory import MemoryStorage
    from tests.conftest import Drained

    tokens = write_tokens(tmp_path / "tokens.json", {"watcher": ("a", "service"), "kept": ("a", "service")})
    app = App(Settings(listen="127.0.0.1:0", tokens_file=tokens), storage=MemoryStorage())
    await app.start()
    try:
        target = f"127.0.0.1:{app.port}"
        async with fencepost.AsyncClient(target, token="watcher", retry=fencepost.NO_RETRY, timeout=60) as watcher, \
                fencepost.AsyncClient(target, token="kept", retry=fencepost.NO_RETRY, timeout=60) as kept:
            sid = (await kept.open_session("agent", "s")).session_id
            gen = (await kept.acquire_lease(sid, "A", ttl=60)).generation
            revoked = [Drained(watcher.watch_inbox(sid, gen)), Drained(watcher.watch_due(sid, gen))]
            live = [Drained(kept.watch_inbox(sid, gen)), Drained(kept.watch_due(sid, gen))]
            await asyncio.sleep(0.3)  # every watch is open, with nothing to send
            assert not any(d.task.done() for d in revoked + live)
            write_tokens(tokens, {"kept": ("a", "service")})  # "watcher" revoked
            app.reload_identities()
            for d in revoked:
                await d.end(timeout=3)
            assert [type(d.ended[0]) for d in revoked] == [errors.Unauthenticated] * 2
            assert not any(d.task.done() for d in live)
            await kept.deliver(b"after", session_id=sid)  # the kept caller's watch still delivers
            await live[0].until_seen(1)
            for d in live:
                d.task.cancel()
    finally:
        await app.stop(grace=0.2)
