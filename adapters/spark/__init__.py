"""walkit.adapters.spark is the PySpark data source "walkit": topics and logs in Spark, batch and streaming.

    from walkit.adapters.spark import WalkitDataSource
    spark.dataSource.register(WalkitDataSource)
    df = (spark.read.format("walkit").option("metadata", "sqlite:///.../metadata.db")
          .option("topic", "orders").load())           # key, value, topic, partition, offset, ...

It uses PySpark's Python Data Source API (pyspark >= 4.2: streaming reads with read limits),
no JVM code. Modules:

- source.py: WalkitDataSource, the schemas; options.py: the options and their checks;
- index.py: a log's ledgers, entries and Kafka offsets as the planner sees them;
- reader.py: planning batch and streaming reads (driver); scan.py: reading pieces (executors);
  records.py: Kafka record batches and staged rows;
- writer.py: writes (df.write, writeStream); staging.py: the rows tasks stage; markers.py: the
  marker protocol (exactly once per micro-batch, or per writeId); publishers.py: into a topic or
  a log; credentials.py: keys, SASL and TLS; cluster.py: connecting;
  errors.py: the errors it raises;
- jobs/: the archive job (topic or log to Parquet) and the windowed count job.
"""

from walkit.adapters.spark.errors import ClusterUnreachable, DataLost, NoSuchTopic, OptionError, SparkSourceError
from walkit.adapters.spark.source import LOG_SCHEMA, TOPIC_SCHEMA, WalkitDataSource

__all__ = ["ClusterUnreachable", "DataLost", "LOG_SCHEMA", "NoSuchTopic", "OptionError", "SparkSourceError",
           "TOPIC_SCHEMA", "WalkitDataSource"]
