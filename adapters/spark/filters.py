"""walkit.adapters.spark.filters turns the WHERE clause Spark pushes to a batch read into what to read.

Spark hands `DataSourceReader.pushFilters` the conjuncts of a query's filter
(pyspark.sql.datasource: EqualTo, In, GreaterThan...; PySpark 4.1+, with
spark.sql.python.filterPushdown.enabled). Three columns narrow a topic read before a byte is
fetched:

- `partition` (=, IN, <, <=, >, >=): partitions outside are not planned at all;
- `offset` (=, IN, <, <=, >, >=): each partition's range [lo, hi) shrinks, and the planner's
  bisection (index.py) reads only the entries that hold it;
- `timestamp` (>, >=, =): the broker's time index (ListOffsets, as startingOffsetsByTimestamp)
  gives the first offset at or after it; earlier records cannot match, so they are not read.

Partition and offset predicates are answered exactly, so Spark need not apply them again; a
timestamp predicate only moves the start (CreateTime timestamps need not grow with offsets) and
is given back to Spark to apply to what is read. Any other predicate is given back untouched.
"""

from __future__ import annotations

import datetime

from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

_NO_END = 1 << 62

_RANGE = (EqualTo, In, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _interval(predicate) -> tuple[int, int, set | None]:
    """_interval is [lo, hi) and the allowed values (None: any) of an integer predicate."""
    value = predicate.value
    if isinstance(predicate, EqualTo):
        return value, value + 1, {value}
    if isinstance(predicate, In):
        values = {v for v in value if v is not None}
        return (min(values), max(values) + 1, values) if values else (0, 0, set())
    if isinstance(predicate, GreaterThan):
        return value + 1, _NO_END, None
    if isinstance(predicate, GreaterThanOrEqual):
        return value, _NO_END, None
    if isinstance(predicate, LessThan):
        return 0, value, None
    return 0, value + 1, None                      # LessThanOrEqual


def _millis(value) -> int | None:
    """_millis is a timestamp predicate's value in ms since the epoch (None: not a timestamp)."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(value.timestamp() * 1000)
    return None


class Bounds:
    """Bounds are the partitions, offsets and earliest timestamp a batch read's pushed filters allow."""

    def __init__(self) -> None:
        self.partitions: set[int] | None = None    # None: every partition
        self.partition_range = (0, _NO_END)
        self.offset_range = (0, _NO_END)
        self.offset_values: set[int] | None = None
        self.since: int | None = None              # ms: no record before the first at or after it can match

    def push(self, filters) -> list:
        """push takes what it can of `filters` (module doc) and returns those Spark must still apply."""
        left = []
        for predicate in filters:
            column = predicate.attribute[0] if len(getattr(predicate, "attribute", ())) == 1 else None
            if column in ("partition", "offset") and isinstance(predicate, _RANGE) and self._integer(predicate):
                lo, hi, values = _interval(predicate)
                if column == "partition":
                    self.partition_range = (max(self.partition_range[0], lo), min(self.partition_range[1], hi))
                    if values is not None:
                        self.partitions = values if self.partitions is None else self.partitions & values
                else:
                    self.offset_range = (max(self.offset_range[0], lo), min(self.offset_range[1], hi))
                    if values is not None:
                        self.offset_values = values if self.offset_values is None else self.offset_values & values
                    if values is not None and len(values) > 1:
                        left.append(predicate)         # narrowed to [min, max]: the values between are Spark's
                continue
            if column == "timestamp" and isinstance(predicate, (EqualTo, GreaterThan, GreaterThanOrEqual)):
                ms = _millis(predicate.value)
                if ms is not None:
                    ms += 1 if isinstance(predicate, GreaterThan) and predicate.value.microsecond % 1000 == 0 else 0
                    self.since = ms if self.since is None else max(self.since, ms)
            left.append(predicate)
        return left

    @staticmethod
    def _integer(predicate) -> bool:
        values = predicate.value if isinstance(predicate, In) else (predicate.value,)
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values if v is not None)

    def takes_partition(self, partition: int) -> bool:
        """takes_partition is whether the filters allow records of this partition."""
        lo, hi = self.partition_range
        return lo <= partition < hi and (self.partitions is None or partition in self.partitions)

    def offsets(self, start: int, stop: int) -> tuple[int, int]:
        """offsets narrows [start, stop) to the offsets the filters allow (an empty range: start == stop)."""
        lo, hi = self.offset_range
        if self.offset_values is not None:
            inside = [v for v in self.offset_values if lo <= v < hi]
            lo, hi = (min(inside), max(inside) + 1) if inside else (0, 0)
        start, stop = max(start, lo), min(stop, hi)
        return (start, stop) if start < stop else (start, start)
