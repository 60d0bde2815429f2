"""walkit.adapters.kv.limits holds redis-server 7.0's built-in limits of its small encodings.

Redis stores a small hash, sorted set or set compactly (a listpack or an intset) and switches
to a hash table or skiplist past these sizes. The KV server keeps one representation, but where
Redis' answers show the encoding it answers the same: OBJECT ENCODING names it, HSCAN, SSCAN and
ZSCAN return a small collection whole with cursor 0, and ZSCAN prints a small sorted set's
scores as a listpack does. The values are redis-server's defaults (its sample redis.conf sets
hash-max-listpack-entries to 128; the server's built-in default is 512), and CONFIG SET cannot
change them here.
"""

#: hash-max-listpack-entries: the most fields of a listpack hash.
HASH_ENTRIES = 512
#: zset-max-listpack-entries: the most members of a listpack sorted set.
ZSET_ENTRIES = 128
#: hash-max-listpack-value and zset-max-listpack-value: the longest field, value or member a listpack holds.
LISTPACK_VALUE = 64
#: set-max-intset-entries: the most members of an intset (a set of integers only).
INTSET_ENTRIES = 512
#: The most members of a set or sorted set that SSCAN and ZSCAN started at cursor 0 return whole.
SMALL_SCAN = 128
