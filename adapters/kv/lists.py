"""walkit.adapters.kv.lists: (being written)."""

from __future__ import annotations
