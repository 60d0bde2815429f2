"""walkit.adapters.spark.source is the "walkit" PySpark data source (docs/guides/spark.md).

    spark.dataSource.register(WalkitDataSource)
    spark.read.format("walkit").option("metadata", uri).option("topic", "orders").load()
    spark.readStream.format("walkit").option("metadata", uri).option("log", "events").load()
    df.write.format("walkit").option("metadata", uri).option("topic", "out").mode("append").save()

Options: options.py. Reading: reader.py (planning) and scan.py (executors). Writing: writer.py.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from walkit.adapters.spark.options import parse_sink, parse_source
from walkit.adapters.spark.reader import BatchReader, StreamReader
from walkit.adapters.spark.writer import BatchWriter, StreamWriter

#: The columns of a topic, as Spark's Kafka source has them.
TOPIC_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                "timestampType int, headers array<struct<key: string, value: binary>>")
#: The columns of a topic read with includeHeaders=false.
TOPIC_SCHEMA_WITHOUT_HEADERS = TOPIC_SCHEMA.rsplit(", headers", 1)[0]
#: The columns of a log: each record's position and payload.
LOG_SCHEMA = "ledger_id long, entry_id long, value binary"


class WalkitDataSource(DataSource):
    """WalkitDataSource reads and writes walkit topics and logs from Spark (batch and streaming).

    Reads go from the executors to the bookies directly, one Spark partition per topic
    partition (or ledger range of a log), more for large ranges; streaming offsets live in the
    query's checkpoint. Writes publish each micro-batch exactly once per query and batch id.
    See docs/guides/spark.md for the options and the guarantees.
    """

    @classmethod
    def name(cls) -> str:
        """name is the format name: spark.read.format("walkit")."""
        return "walkit"

    def schema(self) -> str:
        """schema is TOPIC_SCHEMA for topics (without headers if includeHeaders=false), LOG_SCHEMA for a log."""
        if self.options.get("log"):
            return LOG_SCHEMA
        if str(self.options.get("includeHeaders", self.options.get("includeheaders", "true"))).lower() == "false":
            return TOPIC_SCHEMA_WITHOUT_HEADERS
        return TOPIC_SCHEMA

    def reader(self, schema):
        """reader is the batch reader (startingOffsets..endingOffsets)."""
        return BatchReader(parse_source(self.options, streaming=False), schema)

    def streamReader(self, schema):
        """streamReader is the micro-batch reader."""
        return StreamReader(parse_source(self.options, streaming=True), schema)

    def writer(self, schema, overwrite: bool):
        """writer is the batch writer into a topic or a log (append only)."""
        return BatchWriter(parse_sink(self.options), schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        """streamWriter is the exactly-once micro-batch writer into a topic or a log."""
        return StreamWriter(parse_sink(self.options), schema)
