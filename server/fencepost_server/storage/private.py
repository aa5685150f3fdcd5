"""Files and directories that hold stored data, created readable by their
owner only: every tenant's items and the deployment's page-token secret live
in them. An existing file or directory keeps its mode (the operator's choice)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def create_file(path: str | Path) -> None:
    """Create `path`, empty, with FILE_MODE unless it exists."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE))


def make_dirs(path: str | Path) -> None:
    """`mkdir -p path`: `path` itself, when it is created, gets DIR_MODE (the
    parents it needs get the usual mode, as with mkdir -p -m)."""
    Path(path).mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
