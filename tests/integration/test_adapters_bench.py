"""benchmarks/adapters.py --quick: the command runs end to end and writes a table with every row it was asked for.

No speed is asserted: the machine is shared. The subset (the latency floor, walkit.replicate and
SQLite, which share one cluster) needs no other system's server, so the test runs wherever
walkit's own tests do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
GROUPS = ("latency", "replicate", "sqlite")


@pytest.fixture
def specs(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))            # benchmarks/ is not a package
    from adapters_report import SPECS
    return SPECS


def test_the_quick_run_writes_every_requested_row_with_a_figure(tmp_path, specs):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "adapters.py"), "--quick", "--rows", ",".join(GROUPS),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "out" / "adapters.md").read_text()
    assert (tmp_path / "out" / "adapters.json").is_file()
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    expected = [spec.label for spec in specs if spec.group in GROUPS]
    assert set(lines) == {"row", "---", *expected}, table          # every requested row, and only those
    for label in expected:
        cells = [cell.strip() for cell in lines[label].strip("| ").split(" | ")]
        assert cells[1] != "-", lines[label]                         # walkit's figure
        assert cells[-1].split(" ")[0] in ("pass", "miss", "reported"), lines[label]
        assert lines[label] in done.stdout                           # printed as well as written
    assert ("chart: " in done.stdout) != ("chart skipped: matplotlib is not installed" in done.stdout)
