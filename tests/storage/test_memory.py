"""The memory:// backend against the EntryStorage conformance suite (its durability checks skip)."""

from __future__ import annotations

import pytest

from walkit.plugins import open_storage
from walkit.testing.storage import EntryStorageConformance


class TestMemoryConformance(EntryStorageConformance):
    @pytest.fixture
    def storage_factory(self):
        """storage_factory opens a fresh memory storage (the path is ignored: nothing persists)."""
        return lambda path: open_storage("memory://")
