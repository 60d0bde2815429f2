"""walkit.adapters.spark.reader plans batch and streaming reads of topics and logs on the driver.

Planning (`partitions`, `initialOffset`, `latestOffset`) runs on the driver and reads only
metadata and a few entries (index.py); `read` runs on the executors (scan.py). Offsets are
plain JSON, as Spark's Kafka source has them, and live in the query's checkpoint only:

    topics: {"orders": {"0": 1200, "1": 1187}}      the next offset to read, per partition
    a log:  {"events": "12:40"}                     the next position to read, LEDGER:ENTRY

so a restarted query resumes from its checkpoint and the source itself keeps no state a
restart could lose. A partition the query has not seen before (a new topic matching
subscribePattern) starts at its earliest offset. Records the query still needs that retention
removed are DataLost, or skipped with failOnDataLoss=false.
"""

from __future__ import annotations

import math
import time

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from walkit.adapters.spark.cluster import (
    connect, offsets_for_times, partition_log, reaching, resolve_topics, snapshot_next_offset,
)
from walkit.adapters.spark.errors import CompactedTopic, DataLost, NoSuchTopic, OptionError
from walkit.adapters.spark.filters import Bounds
from walkit.adapters.spark.index import LogIndex, Piece
from walkit.adapters.spark.options import EARLIEST, LATEST, SourceOptions
from walkit.adapters.spark.scan import read_piece
from walkit.core.loglist import Position


class PieceInput(InputPartition):
    """PieceInput carries one Piece (index.py) to the executor that reads it."""

    def __init__(self, piece: Piece) -> None:
        super().__init__(piece)
        self.piece = piece


class Planner:
    """Planner knows the partitions of the topics (or the log) a query reads, and where each begins and ends."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.client = connect(options.metadata, options.timeout, options.credentials.key)
        self.topics: dict = {}
        self.indexes: dict = {}

    def reaching(self, what: str):
        """reaching wraps cluster calls so a dead cluster is reported as ClusterUnreachable."""
        return reaching(self.options.metadata, what)

    # -- topics ------------------------------------------------------------------------------
    def partitions(self) -> list[tuple[str, int]]:
        """partitions lists (topic, partition) of the topics read, as the catalog has them now."""
        with self.reaching("listing topics"):
            self.topics = resolve_topics(self.client, self.options.metadata, self.options.topics,
                                         self.options.pattern)
        compacted = sorted(name for name, topic in self.topics.items() if "compact" in topic.config("cleanup.policy"))
        if compacted and self.options.pattern is None:
            raise CompactedTopic(f"topic {', '.join(compacted)} is compacted (cleanup.policy=compact), which this "
                                 f"reader cannot read; read it through a Kafka client (spark-sql-kafka) instead")
        for name in compacted:                       # matched by subscribePattern: left out
            del self.topics[name]
        assigned = self.options.assigned
        if assigned is None:
            return [(name, p) for name, topic in self.topics.items() for p in range(topic.partitions)]
        for name, parts in assigned.items():
            missing = [p for p in parts if p >= self.topics[name].partitions]
            if missing:
                raise NoSuchTopic(f"option assign names partition {missing[0]} of topic {name!r}, which has "
                                  f"{self.topics[name].partitions}")
        return [(name, p) for name, parts in assigned.items() for p in parts]

    def timestamp_starts(self, tps, stamps) -> dict:
        """timestamp_starts is startingOffsetsByTimestamp / startingTimestamp (`stamps`) as offsets per partition:
        the first offset at or after each timestamp, LATEST where none is."""
        if isinstance(stamps, int):
            stamps = {tp: stamps for tp in tps}
        wanted = {tp: ms for tp, ms in stamps.items() if tp in set(tps)}
        if not wanted:
            return {}
        with self.reaching("finding offsets by timestamp"):
            found = offsets_for_times(self.client, self.options, wanted)
        return {tp: LATEST if offset is None else offset for tp, offset in found.items()}

    def index(self, key) -> LogIndex:
        """index is the refreshed LogIndex of a topic partition (topic, partition) or of the log (its name)."""
        if isinstance(key, tuple):
            topic = self.topics[key[0]]
            name = partition_log(topic, key[1])
            key = (key[0], key[1], topic.id)
        else:
            name = key
        index = self.indexes.get(key)
        if index is None:
            index = self.indexes[key] = LogIndex(self.client, name, self.options.password)
        with self.reaching(f"reading the ledgers of {name}"):
            return index.refresh(missing_ok=isinstance(key, tuple))

    def bounds(self, tp: tuple[str, int]) -> tuple[int, int, LogIndex]:
        """bounds is (earliest offset, end offset, index) of a topic partition as the bookies show it now."""
        index = self.index(tp)
        with self.reaching(f"reading {tp[0]}-{tp[1]}"):
            earliest, end = index.earliest(), index.end_offset()
            if end is None:                   # no batch in the log: empty, or all removed by retention
                end = snapshot_next_offset(self.client, self.topics[tp[0]], tp[1], self.options.password)
                earliest = end
        return earliest, end, index

    def start_offset(self, tp, wanted: int, earliest: int, end: int) -> int:
        """start_offset checks a start offset against what is left (failOnDataLoss) and returns where to read from."""
        if wanted == EARLIEST:
            return earliest
        if wanted == LATEST:
            return end
        if wanted < earliest:
            if self.options.fail_on_data_loss:
                raise DataLost(f"offsets {wanted}..{earliest - 1} of {tp[0]}-{tp[1]} were removed by retention "
                               f"before this query read them (the partition now starts at {earliest}). "
                               f"Set failOnDataLoss=false to skip them")
            return earliest
        if wanted > end:
            if self.options.fail_on_data_loss:
                raise DataLost(f"{tp[0]}-{tp[1]} ends at offset {end}, before {wanted} where this query was to "
                               f"go on: was the topic deleted and created again? Set failOnDataLoss=false to "
                               f"start it over from its earliest offset")
            return earliest
        return wanted

    # -- a log --------------------------------------------------------------------------------
    def log_start(self, index: LogIndex, wanted: Position) -> Position:
        """log_start checks a start position of the log against what is left and returns where to read from."""
        first = index.start()
        wanted = index.normal(wanted)
        if wanted < first:
            if self.options.fail_on_data_loss:
                raise DataLost(f"log {index.name!r} was truncated before {wanted} (it now starts at {first}): "
                               f"records this query had not read were removed. Set failOnDataLoss=false to skip them")
            return first
        return wanted

    def pieces_per_partition(self, count: int) -> int:
        return max(1, math.ceil(self.options.min_partitions / max(1, count)))


def _log_position(spec, index: LogIndex, default: str) -> Position:
    spec = default if spec is None else spec
    if spec == "earliest":
        return index.start()
    if spec == "latest":
        return index.end()
    return spec


def _wanted(spec, tp, default: int) -> int:
    if spec == "earliest":
        return EARLIEST
    if spec == "latest":
        return LATEST
    return spec.get(tp, default)


class BatchReader(DataSourceReader):
    """BatchReader reads the offsets startingOffsets..endingOffsets of the topics, or positions of the log."""

    def __init__(self, options: SourceOptions, schema) -> None:
        self.options = options
        self.schema = schema
        self.bounds = Bounds()

    def pushFilters(self, filters):
        """pushFilters takes the predicates on partition, offset and timestamp that narrow what is read (filters.py):
        partition and offset ones are answered exactly and not returned; timestamp ones narrow the start
        and are returned, for Spark to apply to the records read."""
        return self.bounds.push(filters) if self.options.log is None else filters

    def partitions(self):
        """partitions plans the read: one piece per partition, more for a range above maxRecordsPerPartition."""
        planner = Planner(self.options)
        options = self.options
        if options.log is not None:
            index = planner.index(options.log)
            start = planner.log_start(index, _log_position(options.starting, index, "earliest"))
            end = _log_position(options.ending, index, "latest")
            if end > index.end():
                raise OptionError(f"endingOffsets {end} is beyond the end of log {options.log!r} ({index.end()})")
            pieces = index.split_positions(start, end, options.max_records_per_partition, options.min_partitions)
            return [PieceInput(piece) for piece in pieces]
        tps = [tp for tp in planner.partitions() if self.bounds.takes_partition(tp[1])]
        per = planner.pieces_per_partition(len(tps))
        starts = planner.timestamp_starts(tps, options.starting_timestamps) if options.starting_timestamps else {}
        if self.bounds.since is not None:          # a pushed timestamp predicate: no earlier offset can match
            since = planner.timestamp_starts(tps, self.bounds.since)
            starts = {tp: _later(starts.get(tp, _wanted(options.starting, tp, EARLIEST)), since[tp]) for tp in tps}
        pieces = []
        for tp in tps:
            earliest, end, index = planner.bounds(tp)
            wanted = starts.get(tp, _wanted(options.starting, tp, EARLIEST))
            if tp in starts and wanted >= 0:       # from the broker, whose end may lead the bookies' by an entry
                wanted = min(wanted, end)
            start = planner.start_offset(tp, wanted, earliest, end)
            stop = _wanted(options.ending, tp, LATEST)
            stop = end if stop == LATEST else stop
            if tp in starts:                       # a timestamp start past endingOffsets reads nothing
                start = min(start, max(stop, earliest))
            if stop > end:
                raise OptionError(f"endingOffsets {stop} of {tp[0]}-{tp[1]} is beyond its end ({end})")
            if stop < start:
                raise OptionError(f"endingOffsets {stop} of {tp[0]}-{tp[1]} is before its start ({start})")
            start, stop = self.bounds.offsets(start, stop)
            with planner.reaching(f"planning {tp[0]}-{tp[1]}"):
                pieces += index.split_offsets(tp[0], tp[1], start, stop, options.max_records_per_partition, per)
        return [PieceInput(piece) for piece in pieces]

    def read(self, partition: PieceInput):
        """read yields the piece's records (on an executor) as Arrow batches."""
        return _read(self.options, self.schema, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """StreamReader reads topics or a log as they grow; offsets are JSON kept in Spark's checkpoint (module doc)."""

    def __init__(self, options: SourceOptions, schema) -> None:
        self.options = options
        self.schema = schema
        self._planner: Planner | None = None
        self._available_now: dict | None = None
        self._last_batch: float | None = None     # monotonic time of the last micro-batch planned (maxTriggerDelay)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_planner"] = None              # executors need the options only
        return state

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    # -- offsets --------------------------------------------------------------------------------
    def _ends(self) -> dict:
        """_ends are the end offsets (or the log's end position) now, in the offset JSON shape."""
        planner = self.planner
        if self.options.log is not None:
            return {self.options.log: str(planner.index(self.options.log).end())}
        ends: dict = {}
        for tp in planner.partitions():
            ends.setdefault(tp[0], {})[str(tp[1])] = planner.bounds(tp)[1]
        return ends

    def initialOffset(self) -> dict:
        """initialOffset resolves startingOffsets for a query that has no checkpoint yet."""
        planner, options = self.planner, self.options
        if options.log is not None:
            index = planner.index(options.log)
            return {options.log: str(planner.log_start(index, _log_position(options.starting, index, "latest")))}
        offsets: dict = {}
        tps = planner.partitions()
        starts = planner.timestamp_starts(tps, options.starting_timestamps) if options.starting_timestamps else {}
        for tp in tps:
            earliest, end, _ = planner.bounds(tp)
            wanted = starts.get(tp, _wanted(options.starting, tp, LATEST if options.starting == "latest" else EARLIEST))
            if tp in starts and wanted >= 0:
                wanted = min(wanted, end)
            offsets.setdefault(tp[0], {})[str(tp[1])] = planner.start_offset(tp, wanted, earliest, end)
        return offsets

    def getDefaultReadLimit(self):
        """getDefaultReadLimit is maxOffsetsPerTrigger as a ReadMaxRows limit (none if the option is unset)."""
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """prepareForTriggerAvailableNow fixes the end of an availableNow run: what is there now."""
        self._available_now = self._ends()

    def latestOffset(self, start: dict, limit) -> dict:
        """latestOffset is where the next micro-batch ends: everything there, at most `limit` records more."""
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self.options.log is not None:
            return self._latest_position(start, budget)
        planner = self.planner
        available = {}
        for tp in planner.partitions():
            earliest, end, _ = planner.bounds(tp)
            if self._available_now is not None:
                end = min(end, self._available_now.get(tp[0], {}).get(str(tp[1]), end))
            begin = start.get(tp[0], {}).get(str(tp[1]))
            begin = earliest if begin is None else min(max(begin, earliest), end)
            available[tp] = (begin, end)
        for name in start:
            if name not in planner.topics and self.options.fail_on_data_loss:
                raise DataLost(f"topic {name!r} was deleted while this query read it. "
                               f"Set failOnDataLoss=false to go on without it")
        takes = _share({tp: e - b for tp, (b, e) in available.items()}, budget)
        if not any(takes.values()) or self._waits_for_more(sum(takes.values())):
            return start
        latest: dict = {}
        for tp, (begin, end) in available.items():
            before = start.get(tp[0], {}).get(str(tp[1]))
            latest.setdefault(tp[0], {})[str(tp[1])] = begin + takes[tp] if takes[tp] or before is None else before
        return latest

    def _waits_for_more(self, count: int) -> bool:
        """_waits_for_more is whether a micro-batch of `count` records waits for minOffsetsPerTrigger, as Spark's
        Kafka source does: until that many are there or maxTriggerDelay has passed since the last batch
        (an availableNow run never waits)."""
        least = self.options.min_offsets_per_trigger
        now = time.monotonic()
        if self._last_batch is None:
            self._last_batch = now
        if least is None or self._available_now is not None or count >= least \
                or now - self._last_batch >= self.options.max_trigger_delay:
            self._last_batch = now
            return False
        return True

    def _latest_position(self, start: dict, budget: int | None) -> dict:
        name = self.options.log
        index = self.planner.index(name)
        end = index.end()
        if self._available_now is not None:
            end = min(end, Position.parse(self._available_now[name]))
        begin = index.normal(Position.parse(start[name]))
        begin = max(begin, index.start())
        if budget is not None:
            end = index.advance(begin, budget, end)
        segments = index.segments(begin, end)
        if not segments or self._waits_for_more(sum(segment.entries for segment in segments)):
            return start
        return {name: str(end)}

    def reportLatestOffset(self):
        """reportLatestOffset is the ends now, for the query's progress reports."""
        return self._ends()

    # -- planning and reading ----------------------------------------------------------------------
    def partitions(self, start: dict, end: dict):
        """partitions plans the micro-batch start..end (offsets from the checkpoint)."""
        planner, options = self.planner, self.options
        if options.log is not None:
            index = planner.index(options.log)
            begin = planner.log_start(index, Position.parse(start[options.log]))
            stop = Position.parse(end[options.log])
            pieces = index.split_positions(begin, stop, options.max_records_per_partition, options.min_partitions)
            return [PieceInput(piece) for piece in pieces]
        planner.partitions()
        wanted = [(name, int(p), stop) for name, parts in end.items() for p, stop in parts.items()]
        per = planner.pieces_per_partition(len(wanted))
        pieces = []
        for name, p, stop in wanted:
            tp = (name, p)
            if name not in planner.topics:
                if options.fail_on_data_loss:
                    raise DataLost(f"topic {name!r} was deleted before this query read offsets up to {stop}")
                continue
            earliest, now_end, index = planner.bounds(tp)
            begin = start.get(name, {}).get(str(p))
            begin = planner.start_offset(tp, EARLIEST if begin is None else begin, earliest, max(now_end, stop))
            with planner.reaching(f"planning {name}-{p}"):
                pieces += index.split_offsets(name, p, begin, min(stop, now_end), options.max_records_per_partition,
                                              per)
        return [PieceInput(piece) for piece in pieces]

    def read(self, partition: PieceInput):
        """read yields the piece's records (on an executor) as Arrow batches."""
        return _read(self.options, self.schema, partition)

    def commit(self, end: dict) -> None:
        """commit does nothing: the offsets are in Spark's checkpoint, and nothing is held for the query."""


def _read(options: SourceOptions, schema, partition):
    """_read reads one planned piece on an executor (nothing for Spark's stand-in of an empty plan)."""
    if not isinstance(partition, PieceInput):
        return iter(())
    return read_piece(partition.piece, options.metadata, options.password, options.timeout,
                      options.fail_on_data_loss, schema, options.credentials.key)


def _later(a: int, b: int) -> int:
    """_later is the later of two start offsets, where EARLIEST is before every offset and LATEST after."""
    if LATEST in (a, b):
        return LATEST
    return max(a, b)


def _share(available: dict, budget: int | None) -> dict:
    """_share divides a budget of records over partitions in proportion to what each has (all if no budget)."""
    total = sum(available.values())
    if budget is None or total <= budget:
        return dict(available)
    takes = {key: budget * count // total for key, count in available.items()}
    left = budget - sum(takes.values())
    for key in sorted(available, key=lambda k: available[k] - takes[k], reverse=True):
        if left <= 0:
            break
        if takes[key] < available[key]:
            takes[key] += 1
            left -= 1
    return takes
