"""The pooled random tokens every backend mints versions from (storage/base.py)."""

from __future__ import annotations

import os
import threading

from fencepost_server.storage import random_hex
from fencepost_server.storage.base import new_version


def test_tokens_are_distinct_across_threads_and_pool_refills() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def draw() -> None:
        mine = [new_version() for _ in range(1000)]  # several refills of a 4 KiB pool
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == len(set(seen)) == 4000
    assert all(len(v) == 32 and int(v, 16) >= 0 for v in seen)
    assert len(random_hex(4)) == 8


def test_a_forked_child_does_not_repeat_the_parents_tokens() -> None:
    new_version()  # the pool now holds unused bytes a forked child would inherit
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next tokens, then leave at once
        os.write(write, "".join(new_version() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 1024).decode()
    os.close(read)
    parent = "".join(new_version() for _ in range(3))
    assert len(child) == len(parent) == 96 and child != parent
