"""The sqlite:// metadata backend passes the MetadataStore conformance suite."""

from __future__ import annotations

import pytest

from walkit.testing.metadata import MetadataStoreConformance


class TestSqliteConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, sqlite_factory):
        """metadata_store_factory opens stores on one SQLite file."""
        return sqlite_factory


def test_a_paused_holder_never_touches_its_successors_registration(tmp_path):
    """A process paused past its TTL loses its key; when it wakes it must not refresh or delete the new holder's.

    The holder is SIGSTOPped until its registration lapses, another store registers the key, then
    the holder is resumed and closed: the successor's registration stays, with its value.
    """
    import signal
    import time

    from walkit.plugins import open_metadata
    from walkit.testing.holders import Holder

    url = f"sqlite://{tmp_path}/meta.db?ttl=1&timeout=5"
    with open_metadata(url) as successor:
        holder = Holder("register", url, "bookies/b1", "old")
        try:
            holder.process.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while True:                              # the paused holder's row lapses, then the key is free
                try:
                    successor.register("bookies/b1", b"new")
                    break
                except Exception:
                    assert time.monotonic() < deadline, "the paused holder's registration never lapsed"
                    time.sleep(0.1)
            holder.process.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + 3          # let the woken holder run its heartbeats
            while time.monotonic() < deadline:
                assert successor.get("bookies/b1")[0] == b"new"
                time.sleep(0.1)
        finally:
            holder.close()
        assert successor.get("bookies/b1")[0] == b"new"     # the holder's close deleted nothing of ours
