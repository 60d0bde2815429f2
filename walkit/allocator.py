"""walkit.allocator keeps glibc's malloc from giving large buffers back to the kernel after each use.

A walkit process allocates and frees buffers of hundreds of kilobytes all the time: the Cap'n
Proto frames a client sends and a bookie answers, the journal's group-commit buffer, a read's
joined entries. By default glibc serves such sizes with a fresh mmap, or trims its heap as soon
as the freed top passes 128 KiB, so the next buffer is fresh memory again and every 4 KiB page of
it page-faults on first write. In a virtual machine a fault costs about 2 us: joining 700 KB of
entries took 676 us that way against 40 us in reused memory (this 2-core VM), and a bookie and
a client each fault on every frame.

`tune_malloc()` sets two glibc parameters (mallopt) so that freed buffers are reused:

- M_MMAP_THRESHOLD (`mmap_threshold`, 8 MiB): allocations below it come from the heap, not
  from mmap;
- M_TRIM_THRESHOLD (`trim_threshold`, 16 MiB): the heap is given back to the kernel only once
  more than this is free at its top, so a process keeps up to this much memory resident per
  malloc arena after a burst.

walkit's own processes (every `walkit` command: bookies, `walkit kv serve`, the topics broker,
`walkit bench`) call it at start. An application that embeds the client and appends at high
rates can call `walkit.tune_malloc()` once at start-up. It does nothing where malloc is not
glibc's, when the process already chose through glibc's own environment variables
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES), or when WALKIT_TUNE_MALLOC=0.
"""

from __future__ import annotations

import ctypes
import os

#: Defaults of tune_malloc (bytes).
MMAP_THRESHOLD = 8 << 20
TRIM_THRESHOLD = 16 << 20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3          # glibc's malloc.h
_GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def tune_malloc(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """tune_malloc makes glibc reuse freed buffers of up to `mmap_threshold` bytes (module doc).

    It returns True if glibc took both settings, False if it left malloc as it was: not glibc,
    the process set glibc's malloc variables itself, WALKIT_TUNE_MALLOC=0, or glibc refused a value.
    """
    if not 0 < mmap_threshold <= trim_threshold < 1 << 31:
        raise ValueError("tune_malloc needs 0 < mmap_threshold <= trim_threshold < 2 GiB (mallopt takes an int)")
    if os.environ.get("WALKIT_TUNE_MALLOC", "1") == "0" or any(v in os.environ for v in _GLIBC_VARIABLES):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
    except (AttributeError, ValueError, OSError):       # no confstr, or not glibc
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
