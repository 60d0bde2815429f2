"""walkit.plugins finds storage and metadata backends through entry points, by URI scheme.

This package (the plugins/ folder, installed as walkit.plugins) also holds the built-in
backends: `walkit.plugins.storage` and `walkit.plugins.metadata`.

Backends register under the entry-point groups ``walkit.storage`` and ``walkit.metadata``; the
entry-point name is the URI scheme. `open_storage("files:///data")` and
`open_metadata("zk://127.0.0.1:2181/walkit")` load the class and call its `from_uri`. An unknown
scheme is a PluginNotFound error that lists the installed schemes; a backend whose optional
dependency is missing says what to install.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from urllib.parse import urlsplit

from walkit.errors import ConfigError, PluginNotFound

STORAGE_GROUP = "walkit.storage"
METADATA_GROUP = "walkit.metadata"

#: The pip extra that brings each built-in backend's optional dependency.
_EXTRAS = {"zk": "walkit[zookeeper]", "etcd": "walkit[etcd]"}


@functools.cache
def available(group: str) -> dict[str, object]:
    """available maps each scheme registered in `group` to its (unloaded) entry point."""
    return {ep.name: ep for ep in entry_points(group=group)}


def scheme_of(uri: str) -> str:
    """scheme_of returns the scheme of a backend URI, or raises ConfigError."""
    if not isinstance(uri, str) or "://" not in uri:
        shown = repr(uri) if not isinstance(uri, str) or "@" not in uri else "the URI given"
        raise ConfigError(f"{shown} is not a backend URI; expected scheme://..., e.g. sqlite:///path/meta.db")
    return urlsplit(uri).scheme


def load(group: str, uri: str):
    """load returns the backend class registered for the scheme of `uri` in `group`."""
    scheme = scheme_of(uri)
    plugins = available(group)
    if scheme not in plugins:
        installed = ", ".join(sorted(plugins)) or "none"
        from walkit.plugins.metadata.credentials import redact
        raise PluginNotFound(f"no {group} plugin for scheme {scheme!r} (in {redact(uri)!r}); installed: {installed}")
    try:
        return plugins[scheme].load()
    except ImportError as exc:
        hint = f"; install {_EXTRAS[scheme]}" if scheme in _EXTRAS else ""
        raise PluginNotFound(f"the {scheme!r} plugin cannot be loaded: {exc}{hint}") from exc


def open_storage(uri: str, **options):
    """open_storage opens the EntryStorage named by `uri`."""
    return load(STORAGE_GROUP, uri).from_uri(uri, **options)


def open_metadata(uri: str, **options):
    """open_metadata opens the MetadataStore named by `uri`."""
    return load(METADATA_GROUP, uri).from_uri(uri, **options)


def path_of(uri: str) -> str:
    """path_of returns the filesystem path of a ``scheme:///path`` URI (``scheme://relative`` too)."""
    parts = urlsplit(uri)
    path = parts.netloc + parts.path if parts.netloc not in ("", "localhost") else parts.path
    if not path:
        raise ConfigError(f"{uri!r} names no path; expected {parts.scheme}:///absolute/path or "
                          f"{parts.scheme}://relative/path")
    return path
