"""walkit.collector makes Python's cycle collector run less often over objects that die young anyway.

CPython frees most objects by reference counting; its cycle collector runs besides, once
`threshold0` more container objects were allocated than freed, and walks every tracked container
allocated since its last run that is still alive; those it promotes to the middle generation,
which is walked again at every `threshold1`-th young collection. The count never goes below
zero, so when a burst of frees (a frame of replies completing hundreds of appends) is followed
by a burst of allocations (the next appends), the second burst counts in full. The
interpreter's default of 700 suits programs that hold few objects for a short while. A walkit
client with 1,000 appends in flight holds about 12 containers per append (its Future, the
pending entry, the lists of its batch): most of them are still alive at the young collection
after them, walked there and promoted, and many walked again in the middle generation. That
was 2.2 us of the client's 12 us of CPU per pipelined append (this 2-core VM).

`tune_gc()` raises `threshold0` to `threshold` (10,000), so most of those objects are freed
before a collection sees them. `threshold1` and `threshold2` keep their values; as they count
collections of the younger generation, the older generations are collected about 14 times less
often too. Measured in one client process, 4 interleaved rounds of 100,000 pipelined appends:
9.95 us of CPU per append against 11.71 at 700, 64.4k against 58.3k appends/s; disabling the
collector entirely was no better (10.06 us).

The cost: garbage that only the collector can free (reference cycles) is found later, and how
much memory it holds meanwhile depends on what the cycles hold. Appends make none:
`gc.DEBUG_SAVEALL` over 20,000 pipelined appends found no garbage.

walkit's own processes (every `walkit` command) call it at start. An application that embeds the
client and appends at high rates can call `walkit.tune_gc()` once at start-up. It only ever
raises the threshold: a process that disabled the collector, or already chose a threshold at
least as high, is left alone; so is every process with WALKIT_TUNE_GC set to 0.
"""

from __future__ import annotations

import gc
import os

#: tune_gc's young-generation threshold (container allocations between two collections).
THRESHOLD = 10_000


def tune_gc(threshold: int = THRESHOLD) -> bool:
    """tune_gc raises the cycle collector's young-generation threshold to `threshold` (module doc).

    It returns True if it raised it, False if it left the collector as it was: WALKIT_TUNE_GC=0,
    the collector is disabled or collects only when asked (threshold 0), or its threshold is
    already at least `threshold`.
    """
    if not isinstance(threshold, int) or isinstance(threshold, bool) or not 0 < threshold < 1 << 31:
        raise ValueError(f"tune_gc needs a positive number of allocations below 2**31, not {threshold!r}")
    if os.environ.get("WALKIT_TUNE_GC", "1") == "0" or not gc.isenabled():
        return False
    young, *older = gc.get_threshold()
    if young == 0 or young >= threshold:
        return False
    gc.set_threshold(threshold, *older)
    return True
