"""Page tokens: sealed positions that open only for the tenant and listing
they were issued to, under the key every replica of a backend shares."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost import reasons
from fencepost_server.domain.errors import InvalidArgument
from fencepost_server.domain.paging import PAGE_KEY_ITEM, PageTokens, secret_from_file
from fencepost_server.storage import BackendUnavailable, CasResult, PersistenceUncertain, Storage
from fencepost_server.storage.memory import MemoryStorage

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
listing = st.lists(st.one_of(text, st.integers(), st.booleans()), min_size=1, max_size=4)
PAGES = PageTokens.ephemeral()


def _run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def _refused(tokens: PageTokens, tenant: str, where: list[object], token: str) -> bool:
    try:
        _run(tokens.resume(tenant, where, token))
    except InvalidArgument as exc:
        assert exc.reason == reasons.PAGE_TOKEN_INVALID and exc.field == "page_token"
        return True
    return False


@given(text, listing, text)
def test_a_token_resumes_its_own_listing(tenant: str, where: list[object], position: str) -> None:
    token = _run(PAGES.issue(tenant, where, position))
    assert _run(PAGES.resume(tenant, where, token)) == position
    assert token.isascii() and "=" not in token


@settings(max_examples=50)
@given(text, listing, text, text)
def test_another_tenant_or_listing_is_refused(tenant: str, where: list[object], position: str, other: str) -> None:
    token = _run(PAGES.issue(tenant, where, position))
    if other != tenant:
        assert _refused(PAGES, other, where, token)
    assert _refused(PAGES, tenant, [*where, other], token)
    assert _refused(PageTokens.ephemeral(), tenant, where, token)  # another deployment's key


@settings(max_examples=30)
@given(text, st.data())
def test_every_truncation_and_bit_flip_is_refused(position: str, data: st.DataObject) -> None:
    token = _run(PAGES.issue("t", ["kv.list", "p/"], position))
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    cut = data.draw(st.integers(1, len(token) - 1))  # cut to nothing is no token: the first page
    assert _refused(PAGES, "t", ["kv.list", "p/"], token[:cut])
    at, bit = data.draw(st.integers(0, len(raw) - 1)), data.draw(st.integers(0, 7))
    raw[at] ^= 1 << bit
    flipped = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    assert _refused(PAGES, "t", ["kv.list", "p/"], flipped)


@settings(max_examples=30)
@given(st.data())
def test_any_edit_of_the_text_is_refused(data: st.DataObject) -> None:
    """Inserted characters the base64 decoder would skip, or a last character
    that decodes to the same bytes, are edits too."""
    token = _run(PAGES.issue("t", ["kv.list", "p/"], "k/1"))
    at = data.draw(st.integers(0, len(token)))
    inserted = token[:at] + data.draw(st.sampled_from([".", "!", " ", "=", "\n", "A"])) + token[at:]
    assert _refused(PAGES, "t", ["kv.list", "p/"], inserted)
    last = token[-1]
    for other in "AQgw":  # a different final character, possibly the same decoded bytes
        if other != last:
            assert _refused(PAGES, "t", ["kv.list", "p/"], token[:-1] + other)


def test_the_position_is_not_in_the_clear() -> None:
    position = "customers/acme/invoice-2026-11"
    token = _run(PAGES.issue("t", ["kv.list", ""], position))
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    assert b"acme" not in raw and "acme" not in token
    # two tokens for one position differ (a random nonce): equal positions are not linkable
    assert token != _run(PAGES.issue("t", ["kv.list", ""], position))


async def test_replicas_of_one_backend_share_the_key_and_others_do_not() -> None:
    shared: Storage = MemoryStorage()
    first, second = PageTokens.of_deployment(shared), PageTokens.of_deployment(shared)
    # both reach for the key at once: one mints it, the other reads it
    tokens = await asyncio.gather(first.issue("t", ["l"], "p1"), second.issue("t", ["l"], "p2"))
    assert await second.resume("t", ["l"], tokens[0]) == "p1"
    assert await first.resume("t", ["l"], tokens[1]) == "p2"
    stored = await shared.get(PAGE_KEY_ITEM)
    assert stored is not None and len(stored.value) == 32 and PAGE_KEY_ITEM.startswith("#/")
    elsewhere = PageTokens.of_deployment(MemoryStorage())
    with pytest.raises(InvalidArgument):
        await elsewhere.resume("t", ["l"], tokens[0])


class _LostPuts(MemoryStorage):
    """put_if_absent ends uncertain: applied (`lands`) or not."""

    def __init__(self, lands: bool) -> None:
        super().__init__()
        self.lands, self.puts = lands, 0

    async def put_if_absent(self, key: str, value: bytes) -> CasResult:
        self.puts += 1
        if self.lands:
            await super().put_if_absent(key, value)
        raise PersistenceUncertain("response lost")


async def test_an_uncertain_mint_of_the_key_is_settled_by_reading_it() -> None:
    """A listing writes nothing of its caller's: an uncertain put of the key
    is read back, never reported as PERSISTENCE_UNCERTAIN."""
    landed = _LostPuts(lands=True)
    token = await PageTokens.of_deployment(landed).issue("t", ["l"], "p1")
    assert await PageTokens.of_deployment(landed).resume("t", ["l"], token) == "p1"
    lost = _LostPuts(lands=False)
    with pytest.raises(BackendUnavailable) as refused:
        await PageTokens.of_deployment(lost).issue("t", ["l"], "p1")
    assert not isinstance(refused.value, PersistenceUncertain) and lost.puts == 3
    assert await lost.get(PAGE_KEY_ITEM) is None


def test_an_operator_supplied_key_file(tmp_path: Path) -> None:
    good = tmp_path / "key"
    good.write_text("ab" * 32 + "\n")
    assert secret_from_file(good) == bytes.fromhex("ab" * 32)
    for bad in ("ab" * 31, "zz" * 32, ""):
        good.write_text(bad)
        with pytest.raises(ValueError):
            secret_from_file(good)
