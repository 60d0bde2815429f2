"""walkit.plugins.storage.files is the ``files:///dir`` bookie storage: journal, entry logs, per-ledger index.

See `walkit.plugins.storage.files.storage` for the design (write path, checkpoints, recovery) and
the other modules for the file formats.
"""

from walkit.plugins.storage.files.storage import FileStorage

__all__ = ["FileStorage"]
