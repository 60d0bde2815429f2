"""walkit.plugins.metadata holds the built-in MetadataStore backends and the key rules they share.

Keys are ``a/b/c`` paths: no leading, trailing or doubled ``/``. The ZooKeeper and etcd
stores keep `next_id` counters under the reserved key ``.counters`` of their root.
"""

from __future__ import annotations

from walkit.errors import ConfigError

#: Counters (`next_id`) of the server-backed stores live under this key; keys below it are reserved.
COUNTERS = ".counters"


def check_key(key: str) -> str:
    """check_key returns `key` if it is an ``a/b/c`` path, or raises ConfigError."""
    if not isinstance(key, str) or not key or key.startswith("/") or key.endswith("/") or "//" in key:
        raise ConfigError(f"invalid metadata key {key!r}: use a/b/c paths without leading or trailing '/'")
    return key
