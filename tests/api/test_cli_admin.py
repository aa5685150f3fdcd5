"""`fencepost admin erase-agent|erase-tenant|operation` through a real server."""

from __future__ import annotations

import fencepost
from fencepost.cli import Exit
from tests.api.test_cli import cli, srv  # noqa: F401 (the fixture)
from tests.conftest import RunningServer


async def test_erase_agent_waits_until_done_and_the_agent_is_gone(srv: RunningServer) -> None:  # noqa: F811
    async with fencepost.AsyncClient(srv.target) as fp:
        for agent in ("a1", "a2"):
            sid = (await fp.open_session(agent, "chat")).session_id
            gen = (await fp.acquire_lease(sid, "w", ttl=60)).generation
            await fp.commit(sid, gen, 0, [b"r"])
            await fp.memory_append(agent, f"a fact of {agent}")

        res = await cli(srv, "admin", "erase-agent", "a1", "--json")
        assert res.rc == Exit.OK, res.err
        op = res.json()
        assert op["done"] and op["phase"] == "done" and op["sessions_fenced"] == 1 and op["items_erased"] > 0
        assert [s async for s in fp.list_sessions("a1")] == []
        assert len([s async for s in fp.list_sessions("a2")]) == 1

        again = await cli(srv, "admin", "operation", op["name"], "--json")
        assert again.rc == Exit.OK and again.json()["done"]
        text = await cli(srv, "admin", "erase-agent", "a2")
        assert text.rc == Exit.OK and "erasure started: operations/erase-" in text.err
        assert "done" in text.out and "items_erased" in text.out


async def test_no_wait_returns_the_operation_and_a_request_id_returns_it_again(srv: RunningServer) -> None:  # noqa: F811
    first = await cli(srv, "admin", "erase-agent", "a3", "--no-wait", "--request-id", "gdpr-17", "--json")
    assert first.rc == Exit.OK, first.err
    second = await cli(srv, "admin", "erase-agent", "a3", "--request-id", "gdpr-17", "--json")
    assert second.rc == Exit.OK and second.json()["name"] == first.json()["name"] and second.json()["done"]


async def test_erase_tenant_needs_confirm(srv: RunningServer) -> None:  # noqa: F811
    async with fencepost.AsyncClient(srv.target) as fp:
        await fp.put("keep/me", b"x")
        res = await cli(srv, "admin", "erase-tenant")
        assert res.rc == Exit.USAGE and "--confirm" in res.err
        assert (await fp.get("keep/me")) is not None
        res = await cli(srv, "admin", "erase-tenant", "--confirm", "--json")
        assert res.rc == Exit.OK and res.json()["done"], res.err
        assert (await fp.get("keep/me")) is None


async def test_an_unknown_operation_is_exit_3(srv: RunningServer) -> None:  # noqa: F811
    res = await cli(srv, "admin", "operation", "operations/erase-nope")
    assert res.rc == Exit.NOT_FOUND and "erase-nope" in res.err
