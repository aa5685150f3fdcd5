"""`python -m fencepost`: the client CLI (kv, ledger, journal, memory)."""

import sys

from .cli import main

sys.exit(main(prog="fencepost"))
