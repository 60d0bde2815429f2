"""The replicated counter of the docs runs as printed (examples/replicated_counter.py, included by
docs/getting-started.md and docs/guides/replicate.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "replicated_counter.py")


def test_the_replicated_counter_example_counts_ten_on_every_node(tmp_path):
    result = subprocess.run([sys.executable, EXAMPLE], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.split("\n")[:3])
    assert [line.split()[-1] for line in lines] == ["10", "10", "10"]
    assert sum("leader" in line for line in lines) == 1
