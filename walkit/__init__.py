"""walkit is a replicated write-ahead log: Apache BookKeeper's protocol as a Python SDK.

    import walkit
    with walkit.LocalCluster(bookies=3) as cluster, walkit.Client(cluster.metadata_url) as client:
        w = client.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        w.append(b"hello")

See README.md for concepts, configuration and the command line.
"""

from walkit import errors
from walkit.client.api import Client, ReadHandle, WriteHandle
from walkit.client.log import LogRecord, LogWriter
from walkit.core.loglist import LogConfig, LogMetadata, Position
from walkit.core.messages import Entry
from walkit.election import LeaderElection
from walkit.core.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from walkit.local import LocalCluster

__all__ = [
    "CLOSED", "Client", "Entry", "IN_RECOVERY", "LeaderElection", "LedgerMetadata", "LocalCluster", "LogConfig", "LogMetadata",
    "LogRecord", "LogWriter", "OPEN", "Position", "ReadHandle", "WriteHandle", "errors",
]
__version__ = "0.1.0"
