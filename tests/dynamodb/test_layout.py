"""The key layout's routing rules, as properties over generated keys."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fencepost_server.storage.dynamodb import KeyLayout

# Segments that exercise every default pattern, plus odd ones.
SEGMENTS = st.sampled_from(["t", "u", "kv", "sys", "agentkit", "v1", "#", "req", "0001", "a", "é", ""])
KEYS = st.lists(SEGMENTS, min_size=1, max_size=8).map("/".join)

layout = KeyLayout()


def test_known_keys_land_where_the_layout_says() -> None:
    assert layout.split("t/kv/user/key") == ("t/kv/", "user/key")
    assert layout.split("t/sys/agentkit/v1/bot/journal/1") == ("t/sys/agentkit/v1/bot/", "journal/1")
    assert layout.split("t/sys/ledger/pending") == ("t/sys/ledger/", "pending")
    assert layout.split("#/req/0001/t/abc") == ("#/req/0001/t/", "abc")
    assert layout.split("#/pending/07/x") == ("#/pending/07/", "x")
    assert layout.split("plain") == ("", "plain")
    assert layout.split("a/") == ("a/", "")


def test_kv_lists_pin_one_partition() -> None:
    assert layout.partition_of_prefix("t/kv/") == "t/kv/"
    assert layout.partition_of_prefix("t/kv/some/deep/pre") == "t/kv/"
    assert layout.partition_of_prefix("t/sys/agentkit/v1/bot/") == "t/sys/agentkit/v1/bot/"
    assert layout.partition_of_prefix("t/") is None  # t/kv/, t/sys/... are elsewhere
    assert layout.partition_of_prefix("") is None


@settings(max_examples=300, deadline=None)
@given(KEYS)
def test_split_is_lossless(key: str) -> None:
    partition, rest = layout.split(key)
    assert partition + rest == key
    assert partition == "" or partition.endswith("/")


@settings(max_examples=500, deadline=None)
@given(KEYS, st.integers(min_value=0, max_value=40))
def test_every_key_under_a_prefix_is_where_a_list_looks(key: str, cut: int) -> None:
    prefix = key[:cut]
    partition = layout.split(key)[0]
    only = layout.partition_of_prefix(prefix)
    if only is not None:
        assert partition == only
    else:
        # a walk reads the home partition and every partition named under the prefix
        assert partition == layout.home_of_prefix(prefix) or partition.startswith(prefix)
