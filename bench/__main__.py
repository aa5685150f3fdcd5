"""`python -m bench [NAME ...]`: run the benchmarks (all by default).

Each module in this package with an `async def run(report)` is one benchmark.
Figures are calls/s, p50/p99 and ratios; on this shared 2-core machine the
ratios against a baseline driven by the same harness are the honest figure.
`kv` runs first: the targets of spec/performance.md with pass/fail.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import sys
import time

import bench

from .harness import Reporter

FIRST = ["kv"]


def modules(selected: list[str]) -> list[str]:
    found = sorted(m.name for m in pkgutil.iter_modules(bench.__path__)
                   if m.name not in ("harness", "echo_server") and not m.name.startswith("_"))
    ordered = [m for m in FIRST if m in found] + [m for m in found if m not in FIRST]
    return [m for m in ordered if not selected or m in selected]


async def main(selected: list[str]) -> None:
    report = Reporter()
    for name in modules(selected):
        module = importlib.import_module(f"bench.{name}")
        if not hasattr(module, "run"):
            continue
        print(f"\n== {name} ==", flush=True)
        started = time.perf_counter()
        await module.run(report)
        print(f"({name}: {time.perf_counter() - started:.1f}s)", flush=True)


if __name__ == "__main__":
    # The client side runs on uvloop when installed (as the server does by
    # default): the less CPU the load generator takes on this 2-core machine,
    # the more the figures say about the servers.
    try:
        import uvloop
    except ImportError:
        print("client event loop: asyncio", flush=True)
        asyncio.run(main(sys.argv[1:]))
    else:
        print("client event loop: uvloop", flush=True)
        uvloop.run(main(sys.argv[1:]))
