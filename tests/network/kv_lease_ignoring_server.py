"""kv_lease_ignoring_server runs `walkit kv serve` with a known-bad read rule, for the nemesis's broken-rule test.

    python kv_lease_ignoring_server.py [walkit kv serve options]

A leader answers every read from its own state at once, whether or not its lease runs: the rule
walkit.adapters.kv.reads guards against (a leader cut off from the metadata store, or paused,
keeps believing it leads while another server is elected and takes writes). The nemesis's
checker must find the stale reads this lets through. Never used outside that test.
"""

from __future__ import annotations

import sys

import walkit.adapters.kv.server as server
from walkit.adapters.kv.reads import ReadGate
from walkit.cli import main


class LeaseIgnoringReadGate(ReadGate):
    """LeaseIgnoringReadGate is ReadGate without the lease: a leader never waits for a barrier."""

    def must_wait(self) -> bool:
        if self.server.node.is_leader:
            self.saw_leader()
            return False
        return self._led


if __name__ == "__main__":
    server.ReadGate = LeaseIgnoringReadGate
    sys.exit(main(["kv", "serve", *sys.argv[1:]]))
