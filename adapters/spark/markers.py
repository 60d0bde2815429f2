"""walkit.adapters.spark.markers publishes a named write's staged rows exactly once: the marker protocol.

A write is named by a streaming query's id and micro-batch id, or by a batch write's option
writeId (batch 0). Its commit keeps a marker in the cluster's metadata store, compare-and-swapped:

    spark/sinks/<topic/NAME | log/NAME>/<name>   {"batch": B, "state": "writing", "staged": [[ledger, rows]...],
                                                  "from": <where the sink ended before B>}
                                                 then {"batch": B, "state": "done"}

- A commit that finds B (or a later batch) done publishes nothing: B was written before the
  crash that made Spark replay it, or the user run it again.
- One that finds B "writing" resumes the interrupted commit with the staged ledgers the marker
  names (not its own): it finds what already reached the sink, then publishes the rest. In a
  log, the records from "from" on (the interrupted writer's position before its first record,
  "LEDGER:ENTRY") are a prefix of the write's rows, once a new writer fenced the interrupted
  one; in a topic, each record carries the header `walkit.spark.write` = "name:B:i" (i: the
  row's place in the write), and the partitions are read from their ends in "from" once the
  bookies confirmed everything acknowledged.
- Otherwise it notes where the sink ends ("from"), writes the "writing" marker with its staged
  ledgers, publishes, and swaps the marker to "done".

Two writers of one sink at once (two queries writing to one log, a program appending to it
meanwhile) break the log's part: records of the other writer after "from" would be counted as
this write's. Topics have no such limit: only tagged records count.
"""

from __future__ import annotations

import json

from walkit.adapters.spark.errors import SinkError
from walkit.adapters.spark.options import SinkOptions
from walkit.adapters.spark.publishers import publisher_for
from walkit.adapters.spark.staging import SINKS, is_done, staged_rows
from walkit.errors import BadVersion, NodeExists, NoSuchKey


def marker_key(options: SinkOptions, name: str) -> str:
    """marker_key is the metadata key of the marker of write `name` into the sink of `options`."""
    return f"{SINKS}/{options.target}/{name}"


def read_marker(client, key: str) -> tuple[dict | None, int | None]:
    """read_marker is the marker at `key` and its version, (None, None) if there is none."""
    try:
        value, version = client.store.get(key)
    except NoSuchKey:
        return None, None
    return json.loads(value), version


def needed(client, options: SinkOptions, name: str) -> set[int]:
    """needed is the staged ledgers an interrupted commit of write `name` still needs (its marker's)."""
    marker, _ = read_marker(client, marker_key(options, name))
    return {ledger for ledger, _ in marker.get("staged", [])} if marker else set()


def publish_once(client, options: SinkOptions, name: str, batch: int, staged: list, *, keep_open: bool) -> bool:
    """publish_once publishes batch `batch` of write `name` from `staged` ([[ledger, rows]...]) unless its
    marker says it was published, resuming an interrupted commit (module doc). It returns whether it
    published. `keep_open` lets a streaming query's log writer stay open for its next commit
    (publishers.py)."""
    key = marker_key(options, name)
    marker, version = read_marker(client, key)
    if is_done(marker, batch):
        return False
    publisher = publisher_for(client, options, name if keep_open else None)
    tag = f"{name}:{batch}"
    try:
        if marker is not None and marker["batch"] == batch and marker["state"] == "writing":
            staged = marker["staged"]
            skip = publisher.written(tag, marker["from"])
        else:
            since = publisher.mark()
            version = _write_marker(client, key, {"batch": batch, "state": "writing", "staged": staged,
                                                  "from": since}, version)
            skip = ()
        publisher.publish(staged_rows(client, [ledger for ledger, _ in staged], options.password), tag, skip)
    finally:
        publisher.close()
    _write_marker(client, key, {"batch": batch, "state": "done"}, version)
    return True


def _write_marker(client, key: str, marker: dict, version) -> int:
    """_write_marker stores the marker by compare-and-swap; SinkError if another run of the write changed it."""
    value = json.dumps(marker).encode()
    try:
        if version is None:
            return client.store.create(key, value)
        return client.store.put(key, value, version)
    except (BadVersion, NodeExists):
        raise SinkError(f"the marker {key} changed under this commit: is another run of the same write (the same "
                        f"checkpoint, or the same writeId) writing to the sink?") from None
