"""walkit.adapters.spark.errors are the errors the "walkit" data source raises.

Spark shows a Python data source's exception, message included, in the query's failure
(a PythonException on the driver), so each message says what was asked, what was found
and what to do.
"""

from __future__ import annotations

from walkit.errors import WalkitError


class SparkSourceError(WalkitError):
    """SparkSourceError is the base of every error of the walkit data source."""


class OptionError(SparkSourceError, ValueError):
    """OptionError is a missing, unknown or malformed option of the data source."""


class NoSuchTopic(SparkSourceError, KeyError):
    """NoSuchTopic is raised for a topic the cluster's catalog does not hold."""

    def __str__(self) -> str:           # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CompactedTopic(SparkSourceError):
    """CompactedTopic is raised for a topic of cleanup.policy=compact named to the reader: its rewritten
    batches live in swap records, out of offset order (walkit.adapters.topics.compaction), which the
    reader, reading the log in offset order, does not follow."""


class DataLost(SparkSourceError):
    """DataLost is raised when records a query still needs were removed (retention, truncation).

    With failOnDataLoss=false the source skips to the earliest records still there instead.
    """


class ClusterUnreachable(SparkSourceError, ConnectionError):
    """ClusterUnreachable is raised when the metadata store or the bookies cannot be reached."""


class SinkError(SparkSourceError):
    """SinkError is raised when publishing a write fails or its marker was changed by someone else."""
