"""walkit.adapters.kv.sets: (being written)."""

from __future__ import annotations
