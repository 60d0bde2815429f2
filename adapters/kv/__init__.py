"""walkit.adapters.kv is a replicated key-value store built on walkit.replicate, served over RESP (the Redis protocol).

    walkit kv serve                       # embedded cluster under ./walkit-data, port 6380
    redis-cli -p 6380 SET greeting hello

The store is a walkit.StateMachine (machine.py): every write command becomes a stamped record
(records.py) that walkit.replicate appends to the log ``replicated-kv-<name>`` and applies, in
log order, once the log acknowledged it, on the leader and on every follower; the state is in
memory (state.py) and snapshots of it go into ledgers of the same cluster. Election, fencing,
replay, tailing, snapshots and truncation are walkit.replicate's; this package holds only what
is the store's own. server.py, resp.py and commands.py speak RESP; reads.py decides when a read
may look at the state; info.py answers INFO and ROLE; service.py runs `walkit kv serve`.
"""
