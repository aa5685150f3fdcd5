"""Backup, restore and migration between backends (docs/lifecycle.md).

Operator tools over the storage contract's bulk half (`export_items`,
`import_items`, `reserve_versions`, `version_watermarks`); never used by the
server's request paths.
"""

from .archive import ArchiveError, ArchiveReader, ArchiveWriter, Header
from .backup import BackupReport, RestoreReport, backup, restore
from .migrate import MigrationReport, migrate, work_dir_for
from .stores import Exit, LifecycleError
from .verify import Comparison, compare

__all__ = [
    "ArchiveError", "ArchiveReader", "ArchiveWriter", "BackupReport", "Comparison", "Exit", "Header",
    "LifecycleError", "MigrationReport", "RestoreReport", "backup", "compare", "migrate", "restore",
    "work_dir_for",
]
