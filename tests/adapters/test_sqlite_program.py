"""An unmodified program written for the sqlite3 module runs on walkit.adapters.sqlite by changing its import.

The program is the tutorial of Python's sqlite3 documentation (tests/adapters/sqlite_programs,
license noted there). It runs once with the standard module and once with its import line
replaced, against an embedded cluster found through WALKIT_METADATA; both print the same.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from walkit.local import LocalCluster

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(os.path.dirname(__file__), "sqlite_programs", "tutorial.py")
ORIGINAL, REPLACED = "import sqlite3\n", "import walkit.adapters.sqlite as sqlite3\n"


def run(source: str, directory, env: dict) -> str:
    path = directory / "program.py"
    path.write_text(source)
    done = subprocess.run([sys.executable, str(path)], cwd=str(directory), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_sqlite3_tutorial_runs_unchanged_but_for_its_import(tmp_path):
    with open(PROGRAM) as f:
        source = f.read()
    assert source.count(ORIGINAL) == 1
    changed = source.replace(ORIGINAL, REPLACED)
    assert [a for a, b in zip(source.splitlines(), changed.splitlines()) if a != b] == [ORIGINAL.strip()]
    (tmp_path / "plain").mkdir()
    (tmp_path / "walkit").mkdir()
    expected = run(source, tmp_path / "plain", {})
    assert "('movie',)" in expected and "The highest scoring Monty Python movie" in expected
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        got = run(changed, tmp_path / "walkit", {"WALKIT_METADATA": cluster.metadata_url + "?ttl=1"})
        with cluster_client(cluster) as client:
            assert "replicated-tutorial" in client.list_logs()        # the transactions went through the log
    assert got == expected


def cluster_client(cluster):
    import walkit
    return walkit.Client(cluster.metadata_url)
