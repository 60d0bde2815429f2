"""walkit.adapters.kv is a replicated key-value store on a walkit log, served over RESP (the Redis protocol).

    walkit kv serve                       # embedded cluster under ./walkit-data, port 6380
    redis-cli -p 6380 SET greeting hello

Every mutation is a record appended to the log ``kv-<name>`` and applied, in log order, only
once the log acknowledged it (records.py, replica.py). The state is in memory (state.py);
snapshots go into ledgers of the same cluster and the log is truncated up to them
(snapshot.py). One server leads through walkit's election; the others tail the log and serve
reads (membership.py, tailer.py). server.py, resp.py and commands.py speak RESP.
"""
