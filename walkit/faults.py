"""walkit.faults holds named failpoints: places where crash tests stop a process on purpose.

Like etcd's gofail, a failpoint is off and costs one set lookup unless a test turns it on. The
core machines name the steps (an `ev.Failpoint(name)` command; the simulator crashes there at
random) and the shell calls `failpoint(name)` when it executes one. A test turns a point on in
a child process with the environment variable WALKIT_FAILPOINTS, read once at import:

    WALKIT_FAILPOINTS="log.roll.after_cas=kill"      # SIGKILL this process there, as a power cut

or in the same process with `enable(name, action)`, where `action` is "kill" or a callable.
The names in use are listed in FAILPOINTS.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

FAILPOINTS = (
    "log.open.after_create",     # a ledger was created for the log, the list CAS not done yet
    "log.roll.after_create",     # rolling: new ledger created, not yet in the list
    "log.roll.after_cas",        # rolling: new ledger in the list, previous one not closed yet
    "replicate.acked",           # a leader's entry was acknowledged, not applied or answered yet
    "zookeeper.own_log.read",    # a principal's store read its log, not its ACL yet (a deletion may come between)
    "zookeeper.own_log.acl",     # ... read its ACL, not its witness yet
)

_enabled: dict[str, Callable[[], None]] = {}


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def enable(name: str, action: str | Callable[[], None] = "kill") -> None:
    """enable turns failpoint `name` on: "kill" SIGKILLs the process there, a callable is called."""
    if name not in FAILPOINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(FAILPOINTS)}")
    _enabled[name] = _kill if action == "kill" else action


def disable(name: str) -> None:
    """disable turns failpoint `name` off."""
    _enabled.pop(name, None)


def failpoint(name: str) -> None:
    """failpoint runs the action enabled for `name`, if any (nothing when it is off)."""
    if _enabled:
        action = _enabled.get(name)
        if action is not None:
            action()


for _spec in filter(None, os.environ.get("WALKIT_FAILPOINTS", "").split(",")):
    _name, _, _action = _spec.partition("=")
    enable(_name.strip(), _action.strip() or "kill")
