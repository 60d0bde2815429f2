"""walkit.core imports no I/O, concurrency, clock or randomness module, directly or transitively.

Why: docs/internals/sans-io.md.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import walkit.core

pytestmark = pytest.mark.processes          # every test here starts a process (tests/conftest.py tiers)

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


# -- what importing the core loads, transitively (issue 12) ---------------------------------------
#: Third-party packages the core may use: the C-backed CRC32C of entry digests. They are imported
#: before the core module in the child process, so what they load themselves is not counted.
CORE_DEPENDENCIES = ("crc32c",)
#: walkit modules the core may load besides its own: the typed errors.
WALKIT_ALLOWED = ("walkit", "walkit.core", "walkit.errors")

_PROBE = """
import json, sys
for dependency in {dependencies!r}:
    __import__(dependency)
before = set(sys.modules)
import {module}
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by(module: str) -> list[str]:
    """loaded_by lists the modules `import module` loads in a fresh interpreter, after the core's dependencies."""
    code = _PROBE.format(dependencies=CORE_DEPENDENCIES, module=module)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(result.stdout)


@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.name)
def test_importing_a_core_module_loads_no_io_module_transitively(path):
    module = f"walkit.core.{path.stem}" if path.stem != "__init__" else "walkit.core"
    loaded = loaded_by(module)
    forbidden = [name for name in loaded if name.split(".")[0] in FORBIDDEN]
    assert forbidden == [], f"import {module} loads {forbidden}"
    foreign = [name for name in loaded if name.startswith("walkit")
               and name not in WALKIT_ALLOWED and not name.startswith("walkit.core.")]
    assert foreign == [], f"import {module} loads walkit modules outside the core: {foreign}"


def test_the_probe_sees_transitive_imports():
    """The probe would notice: the client's loop loads Cap'n Proto through the wire codec."""
    assert "capnp" in loaded_by("walkit.client.loop")


def test_walkit_errors_imports_nothing_forbidden():
    """walkit.errors is the one walkit module outside walkit/core that the core loads."""
    assert forbidden_imports((CORE_DIR.parent / "errors.py").read_text()) == []
