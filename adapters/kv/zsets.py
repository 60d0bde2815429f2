"""walkit.adapters.kv.zsets: (being written)."""

from __future__ import annotations
