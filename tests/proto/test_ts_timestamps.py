"""scripts/ts_timestamps.py: the patch make generate applies to ts-proto's
Timestamp JSON helpers, and its refusal of output it does not recognise."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ts_timestamps", ROOT / "scripts" / "ts_timestamps.py")
assert _spec is not None and _spec.loader is not None
ts_timestamps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ts_timestamps)

TO_JSON = "    if (message.at !== undefined) {\n      obj.at = fromTimestamp(message.at).toISOString();\n    }\n"


def test_patches_both_helpers() -> None:
    out = ts_timestamps.patch(TO_JSON + ts_timestamps.TO_TIMESTAMP, "fencepost/v1/evals.ts")
    assert "obj.at = Timestamp.toJSON(message.at);" in out
    assert ts_timestamps.EXACT_TO_TIMESTAMP in out and "Math.trunc" not in out


def test_committed_code_is_patched() -> None:
    gen = ROOT / "client" / "typescript" / "src" / "gen" / "fencepost" / "v1"
    for path in gen.glob("*.ts"):
        text = path.read_text()
        assert ts_timestamps.patch(text, path.name) == text, path.name


@pytest.mark.parametrize("text", [
    ts_timestamps.TO_TIMESTAMP.replace("Math.trunc", "Math.round"),  # another toTimestamp
    "obj.at = fromTimestamp(message.nested.at).toISOString();",  # a JSON path the pattern misses
])
def test_refuses_output_it_does_not_know(text: str) -> None:
    with pytest.raises(SystemExit, match="ts_timestamps"):
        ts_timestamps.patch(text, "fencepost/v1/x.ts")
