"""The sqlite:// metadata backend passes the MetadataStore conformance suite."""

from __future__ import annotations

import pytest

from walkit.testing.metadata import MetadataStoreConformance


class TestSqliteConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, sqlite_factory):
        """metadata_store_factory opens stores on one SQLite file."""
        return sqlite_factory
