"""walkit.faults marks the places where crash tests kill a process on purpose.

`fault_point("log.roll.after_create")` does nothing unless the environment variable
WALKIT_CRASH_AT names that point, in which case the process SIGKILLs itself right there, as a
power cut would. Tests start a subprocess with the variable set to prove that a crash at that
exact step loses nothing acknowledged. The names in use are listed in FAULT_POINTS.
"""

from __future__ import annotations

import os
import signal

FAULT_POINTS = (
    "log.open.after_create",     # a ledger was created for the log, the list CAS not done yet
    "log.roll.after_create",     # rolling: new ledger created, not yet in the list
    "log.roll.after_cas",        # rolling: new ledger in the list, previous one not closed yet
)


def fault_point(name: str) -> None:
    """fault_point kills this process with SIGKILL if WALKIT_CRASH_AT is `name`."""
    if os.environ.get("WALKIT_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
