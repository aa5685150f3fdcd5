"""Makes ts-proto's Timestamp JSON helpers exact (run by generate.sh on src/gen).

The TypeScript client keeps google.protobuf.Timestamp fields as
`{seconds, nanos}` (useDate=false): binary encode/decode are then exact. Two
helpers ts-proto emits for the JSON paths are not, and no option changes them:
- toTimestamp(date) takes nanos as `ms % 1000`, negative before 1970
  (fromJSON of "1969-12-31T23:59:58.500Z" or of a Date): a Timestamp the
  server refuses. Replaced by one that floors the seconds.
- toJSON writes a field through a Date (milliseconds). Replaced by
  Timestamp.toJSON: the canonical RFC 3339 string with every digit kept.
A ts-proto release that emits other code fails here rather than going unpatched.
Usage: ts_timestamps.py GEN_DIR
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TO_TIMESTAMP = """function toTimestamp(date: Date): Timestamp {
  const seconds = Math.trunc(date.getTime() / 1_000).toString();
  const nanos = (date.getTime() % 1_000) * 1_000_000;
  return { seconds, nanos };
}"""

EXACT_TO_TIMESTAMP = """function toTimestamp(date: Date): Timestamp {
  const millis = date.getTime();
  const seconds = Math.floor(millis / 1_000);
  return { seconds: seconds.toString(), nanos: (millis - seconds * 1_000) * 1_000_000 };
}"""

TO_JSON = re.compile(r"fromTimestamp\((message\.\w+)\)\.toISOString\(\)")


def patch(text: str, name: str) -> str:
    if "function toTimestamp(" in text and EXACT_TO_TIMESTAMP not in text:
        if TO_TIMESTAMP not in text:
            raise SystemExit(f"ts_timestamps: {name}: ts-proto's toTimestamp changed; review this patch")
        text = text.replace(TO_TIMESTAMP, EXACT_TO_TIMESTAMP)
    text = TO_JSON.sub(r"Timestamp.toJSON(\1)", text)
    if ".toISOString()" in text and "google/protobuf/timestamp.ts" not in name:
        raise SystemExit(f"ts_timestamps: {name}: a Timestamp still goes to JSON through a Date")
    return text


def main(gen: Path) -> None:
    for path in sorted(gen.rglob("*.ts")):
        text = path.read_text()
        patched = patch(text, path.relative_to(gen).as_posix())
        if patched != text:
            path.write_text(patched)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
