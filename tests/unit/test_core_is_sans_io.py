"""walkit.core imports no I/O, concurrency, clock or randomness module (DESIGN.md §2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import walkit.core

FORBIDDEN = frozenset({"zmq", "capnp", "socket", "threading", "asyncio", "time", "random", "os",
                       "subprocess", "sqlite3", "kazoo"})
CORE_DIR = Path(walkit.core.__file__).parent
CORE_FILES = sorted(CORE_DIR.glob("*.py"))


def forbidden_imports(source: str) -> list[str]:
    """forbidden_imports lists the modules from FORBIDDEN that `source` imports, in any form."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in FORBIDDEN]
    return found


def test_core_has_the_modules_the_design_names():
    names = {path.stem for path in CORE_FILES}
    assert {"metadata", "distribution", "digest", "messages", "events", "writer", "reader",
            "recovery", "bookie"} <= names


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_core_module_imports_nothing_forbidden(path):
    assert forbidden_imports(path.read_text()) == []


@pytest.mark.parametrize("source, expected", [
    ("import zmq", ["zmq"]),
    ("import os.path", ["os.path"]),
    ("import json, time as clock", ["time"]),
    ("from asyncio import Queue", ["asyncio"]),
    ("from kazoo.client import KazooClient", ["kazoo.client"]),
    ("def f():\n    import random\n", ["random"]),
    ("import timeit\nimport ossaudiodev\nfrom sockets_x import y", []),
    ("from . import time", []),
])
def test_forbidden_imports_detects_every_import_form(source, expected):
    assert forbidden_imports(source) == expected
