"""walkit.adapters.spark.scan reads one Piece on an executor, straight from the bookies, as Arrow batches.

A task opens each ledger of its piece without recovery (nothing is fenced: the partition's
leader writes on) and streams the entries. For a topic partition it yields the records with
lo <= offset < hi and applies the partition's own rule for a batch whose offsets a batch
before it already covered (walkit.adapters.topics.partition: skipped), so every offset comes
out once, in order. A ledger that is gone (retention truncated the log after planning) is
data loss: DataLost, or with failOnDataLoss=false the piece ends there.
"""

from __future__ import annotations

from walkit.adapters.spark.cluster import connect, reaching
from walkit.adapters.spark.errors import DataLost
from walkit.adapters.spark.index import Piece
from walkit.adapters.spark.records import Columns, batches, decode_batch
from walkit.adapters.topics.batches import info
from walkit.errors import NoSuchLedger

#: Records per Arrow batch handed to Spark.
ARROW_ROWS = 8192


def _entries(client, piece: Piece, password: bytes, fail_on_data_loss: bool):
    """_entries yields (ledger id, entry id, payload) of the piece's segments, in order."""
    for segment in piece.segments:
        try:
            handle = client.open_ledger(segment.ledger_id, password=password, recover=False)
            if handle.last_add_confirmed < segment.last:
                handle.wait_for_lac(segment.last - 1)
            for entry in handle.read(segment.first, segment.last):
                yield segment.ledger_id, entry.entry_id, entry.payload
        except NoSuchLedger:
            if fail_on_data_loss:
                raise DataLost(f"ledger {segment.ledger_id} of log {piece.log!r} was removed (retention or "
                               f"truncation) before this query read it; its records are lost to the query. "
                               f"Set failOnDataLoss=false to skip what was removed") from None
            return


def read_piece(piece: Piece, metadata: str, password: bytes, timeout: float, fail_on_data_loss: bool, schema,
               key_file: str | None = None):
    """read_piece yields pyarrow RecordBatches of the piece in the source's schema (`schema`, a StructType).

    `key_file` is the client key of a secured cluster (credentials.py).
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    client = connect(metadata, timeout, key_file)
    with reaching(metadata, f"reading {piece.log}"):
        if piece.topic is None:
            yield from _log_batches(client, piece, password, fail_on_data_loss, arrow_schema, pa)
        else:
            yield from _topic_batches(client, piece, password, fail_on_data_loss, arrow_schema, pa)


def _log_batches(client, piece, password, fail_on_data_loss, arrow_schema, pa):
    ledgers, ids, values = [], [], []
    for ledger_id, entry_id, payload in _entries(client, piece, password, fail_on_data_loss):
        ledgers.append(ledger_id)
        ids.append(entry_id)
        values.append(payload)
        if len(ids) >= ARROW_ROWS:
            yield pa.RecordBatch.from_arrays([pa.array(ledgers, pa.int64()), pa.array(ids, pa.int64()),
                                              pa.array(values, pa.binary())], schema=arrow_schema)
            ledgers, ids, values = [], [], []
    if ids:
        yield pa.RecordBatch.from_arrays([pa.array(ledgers, pa.int64()), pa.array(ids, pa.int64()),
                                          pa.array(values, pa.binary())], schema=arrow_schema)


def topic_columns(client, piece: Piece, password: bytes, fail_on_data_loss: bool):
    """topic_columns yields the records of a topic partition's piece as Columns, a few thousand at a time."""
    columns = Columns()
    seen = None                               # the next offset after the last batch taken
    for _ledger, _entry, payload in _entries(client, piece, password, fail_on_data_loss):
        for batch in batches(payload):
            head = info(batch)
            if seen is not None and head.base_offset < seen:
                continue                      # offsets covered already: partition.py skips it too
            seen = head.next_offset
            if seen > piece.lo and head.base_offset < piece.hi:
                decode_batch(batch, piece.lo, piece.hi, columns)
        if len(columns) >= ARROW_ROWS:
            yield columns
            columns = Columns()
        if seen is not None and seen >= piece.hi:
            break
    if len(columns):
        yield columns


def _topic_batches(client, piece, password, fail_on_data_loss, arrow_schema, pa):
    for columns in topic_columns(client, piece, password, fail_on_data_loss):
        yield _topic_arrow(piece, columns, arrow_schema, pa)


def _topic_arrow(piece: Piece, columns: Columns, arrow_schema, pa):
    """_topic_arrow builds one Arrow batch of topic records, column by column (headers flattened, not per row)."""
    count = len(columns)
    arrays = [
        pa.array(columns.keys, pa.binary()),
        pa.array(columns.values, pa.binary()),
        pa.repeat(pa.scalar(piece.topic, pa.string()), count),
        pa.repeat(pa.scalar(piece.partition, pa.int32()), count),
        pa.array(columns.offsets, pa.int64()),
        None,
        pa.array(columns.types, pa.int32()),
    ]
    stamp_type = arrow_schema.field("timestamp").type
    arrays[5] = pa.array(columns.timestamps, pa.int64()).cast(pa.timestamp("ms", tz=stamp_type.tz)).cast(stamp_type)
    if arrow_schema.get_field_index("headers") < 0:      # includeHeaders=false
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
    header_type = arrow_schema.field("headers").type
    offsets, names, values = [0], [], []
    for pairs in columns.headers:
        for name, value in pairs:
            names.append(name)
            values.append(value)
        offsets.append(len(names))
    header_fields = list(header_type.value_type)
    headers = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.StructArray.from_arrays([pa.array(names, pa.string()), pa.array(values, pa.binary())], fields=header_fields),
        type=header_type)
    return pa.RecordBatch.from_arrays([*arrays, headers], schema=arrow_schema)
