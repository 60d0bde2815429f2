"""walkit.adapters.kv.hashes: (being written)."""

from __future__ import annotations
