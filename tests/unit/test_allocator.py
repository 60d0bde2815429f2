"""walkit.allocator.tune_malloc makes glibc reuse freed buffers instead of page-faulting fresh memory for each."""

import os
import platform
import subprocess
import sys

import pytest
from click.testing import CliRunner

import walkit
from walkit.allocator import tune_malloc

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/stat"),
                           reason="mallopt is glibc's; faults are counted from /proc")

# Joins 700 KB of entries 200 times (as a frame or a group commit is built) and prints the
# minor page faults per join, after calling tune_malloc() if asked.
_JOINS = """
import resource, sys
from walkit.allocator import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc() is True
entries = [bytes(1045)] * 666
for _ in range(20):
    buffer = bytearray(); buffer += b"".join(entries)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    buffer = bytearray(); buffer += b"".join(entries)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
"""


def _faults_per_join(mode: str, **env) -> float:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "WALKIT_TUNE_MALLOC")}
    out = subprocess.run([sys.executable, "-c", _JOINS, mode], env={**clean, **env}, capture_output=True, text=True,
                         check=True)
    return float(out.stdout)


@pytest.mark.processes
@glibc
def test_tuned_processes_reuse_large_buffers_where_untuned_ones_fault_on_every_page():
    untuned, tuned = _faults_per_join("plain"), _faults_per_join("tuned")
    assert untuned > 100, untuned          # about 170 pages per 700 KB buffer, each faulted anew
    assert tuned < 5, tuned


@pytest.mark.processes
@glibc
def test_the_process_own_choice_and_the_opt_out_are_left_alone():
    script = "from walkit.allocator import tune_malloc; print(tune_malloc())"
    for env in ({"MALLOC_TRIM_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
                {"WALKIT_TUNE_MALLOC": "0"}):
        out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == "False", env


def test_thresholds_must_be_positive_ordered_and_fit_an_int():
    for mmap_threshold, trim_threshold in ((0, 1 << 20), (2 << 20, 1 << 20), (-1, -1), (1 << 20, 1 << 31)):
        with pytest.raises(ValueError, match="mmap_threshold <= trim_threshold"):
            tune_malloc(mmap_threshold, trim_threshold)


def test_every_walkit_command_tunes_its_allocator_and_collector(monkeypatch):
    import walkit.cli.common as common
    from walkit.cli import main
    calls = []
    monkeypatch.setattr(common, "tune_malloc", lambda: calls.append("malloc"))
    monkeypatch.setattr(common, "tune_gc", lambda: calls.append("gc"))
    result = CliRunner().invoke(main, ["bookies", "--help"])
    assert result.exit_code == 0, result.output
    assert calls == ["malloc", "gc"]


def test_the_knobs_stay_importable_from_walkit_but_are_not_its_top_level_api():
    from walkit.collector import tune_gc
    assert walkit.tune_malloc is tune_malloc and walkit.tune_gc is tune_gc
    assert "tune_malloc" not in walkit.__all__ and "tune_gc" not in walkit.__all__
    assert "tune_malloc" not in dir(walkit) and "tune_gc" not in dir(walkit)
