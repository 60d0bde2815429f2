"""walkit.adapters.kv.scripting: (being written)."""

from __future__ import annotations
