"""walkit.collector.tune_gc lets the young objects of appends in flight die before the cycle collector walks them."""

import os
import subprocess
import sys

import pytest

from walkit.collector import THRESHOLD, tune_gc

# Keeps 1,000 "appends" in flight, each a few containers as a client's pending append is, for
# 100,000 appends: submitted 500 at a time, and completed 500 at a time as one frame of replies
# completes them. Prints how many young-generation collections ran and how many objects they
# walked, after calling tune_gc() if asked. Run in a child: thresholds are process-wide.
_APPENDS = """
import collections, gc, sys
from walkit.collector import tune_gc
if sys.argv[1] == "tuned":
    assert tune_gc() is True
walked = collected = 0
def count(phase, info):
    global walked, collected
    if phase == "start" and info["generation"] == 0:
        collected += 1
        walked += len(gc.get_objects(0))
window = collections.deque()
gc.collect()
gc.callbacks.append(count)
for burst in range(200):
    window.extend(({"id": i}, [i], [None, i]) for i in range(500))
    while len(window) > 1000:
        window.popleft()
gc.callbacks.remove(count)
print(collected, walked)
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "WALKIT_TUNE_GC"}


def _young_collections(mode: str, **env) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _APPENDS, mode], env={**_clean_env(), **env}, capture_output=True,
                         text=True, check=True)
    collected, walked = map(int, out.stdout.split())
    return collected, walked


@pytest.mark.processes
def test_tuned_processes_walk_a_fraction_of_the_young_objects_untuned_ones_walk():
    untuned, tuned = _young_collections("plain"), _young_collections("tuned")
    # Frees first take the young generation's count down to 0, then each burst's ~1,500 new
    # containers are counted again: untuned, a collection every 700 of them walks them all.
    assert untuned[0] > 100, untuned
    assert untuned[1] > 100_000, untuned
    assert tuned[0] < 50, tuned
    assert tuned[1] < untuned[1] / 5, (tuned, untuned)


def _tune_in_child(prelude: str, **env) -> list[str]:
    script = f"import gc\nfrom walkit.collector import tune_gc\n{prelude}\nprint(tune_gc(), gc.get_threshold()[0], gc.isenabled())"
    out = subprocess.run([sys.executable, "-c", script], env={**_clean_env(), **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.split()


def _interpreter_default() -> int:
    out = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"], capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


@pytest.mark.processes
def test_only_ever_raises_the_threshold_of_an_enabled_collector():
    default = _interpreter_default()
    assert default < THRESHOLD
    assert _tune_in_child("") == ["True", str(THRESHOLD), "True"]
    assert _tune_in_child("gc.set_threshold(50_000)") == ["False", "50000", "True"]   # the process's own choice
    assert _tune_in_child(f"gc.set_threshold({THRESHOLD})") == ["False", str(THRESHOLD), "True"]
    assert _tune_in_child("gc.disable()") == ["False", str(default), "False"]
    assert _tune_in_child("gc.set_threshold(0)") == ["False", "0", "True"]            # collects only when asked
    assert _tune_in_child("", WALKIT_TUNE_GC="0") == ["False", str(default), "True"]


@pytest.mark.processes
def test_the_older_generations_thresholds_are_kept():
    script = "import gc\nfrom walkit.collector import tune_gc\ngc.set_threshold(700, 3, 7)\ntune_gc()\nprint(*gc.get_threshold())"
    out = subprocess.run([sys.executable, "-c", script], env=_clean_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(THRESHOLD), "3", "7"]


def test_thresholds_must_be_positive_integers():
    for threshold in (0, -1, 1.5, "10000", True, 1 << 31, 1 << 40):
        with pytest.raises(ValueError, match="positive number of allocations"):
            tune_gc(threshold)
