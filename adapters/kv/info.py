"""walkit.adapters.kv.info is what a server says about itself: INFO, ROLE and CONFIG GET.

The fields follow Redis where Redis has one (role, master_host, loading, db0...), so tools
that read them work; walkit's own are added beside them (walkit_role, leader, epoch,
applied_position, applied_records, lag_entries, snapshot_position, walkit_health, walkit_trouble...).
"""

from __future__ import annotations

import os
import time

from walkit import __version__ as walkit_version

#: The redis-server release whose replies walkit kv answers as (its compatibility suite,
#: tests/adapters/test_kv_compat_*.py, compares them byte for byte against this release).
REDIS_VERSION = "7.0.15"


def walkit_role(server) -> str:
    """walkit_role names what the server does now: loading, follower, promoting, leader or stopped."""
    node = server.node
    if server.stopping:
        return "stopped"
    if node is None or not node.ready:
        return "loading"
    if node.is_leader:
        return "leader"
    return "promoting" if node.election.is_leader else "follower"


def health(node) -> str:
    """health is "ok" or why the node cannot go on (walkit.replicate's status); INFO's walkit_health."""
    if node is None:
        return "ok"
    healthy, why = node.health
    return "ok" if healthy else why.replace("\r", " ").replace("\n", " ")


def _leader_address(server) -> tuple[str, str]:
    node = server.node
    host, _, port = ((node.leader if node is not None else None) or ":").rpartition(":")
    return host, port


def role_reply(server) -> list:
    """role_reply answers ROLE as Redis does: [master, offset, []] or [slave, host, port, state, offset]."""
    machine = server.machine
    if server.is_leader:
        return [b"master", machine.index, []]
    host, port = _leader_address(server)
    if not server.ready:
        state = b"sync"
    else:
        state = b"connected" if host else b"connecting"
    return [b"slave", host.encode(), int(port) if port.isdigit() else -1, state, machine.index]


def config_values(server) -> dict[str, str]:
    """config_values are the settings CONFIG GET reports (enough for redis-benchmark and redis-cli)."""
    return {"port": str(server.port), "bind": server.host, "databases": "1", "save": "", "appendonly": "yes",
            "appendfsync": "always", "maxmemory": "0", "timeout": "0", "protected-mode": "no"}


def info_text(server, sections: list[str]) -> str:
    """info_text is the INFO reply: Redis' sections plus walkit's replication details."""
    node, machine = server.node, server.machine
    now = server.now_ms()
    leading = server.is_leader
    lag = 0 if leading else (node.known_lag if node is not None else None)
    host, port = _leader_address(server)
    epoch = node.election.epoch if node is not None else None
    applied = node.applied if node is not None else None
    snapshot_position = node.snapshot_position if node is not None else None
    with machine.lock:
        keys, expires = machine.state.size(now), len(machine.state.expires)
    parts = {
        "server": [f"redis_version:{REDIS_VERSION}", f"walkit_version:{walkit_version}",
                   "redis_mode:standalone", f"process_id:{os.getpid()}", f"tcp_port:{server.port}",
                   f"uptime_in_seconds:{int(time.monotonic() - server.started)}"],
        "clients": [f"connected_clients:{len(server.connections)}"],
        "replication": [
            f"role:{'master' if leading else 'slave'}", f"walkit_role:{walkit_role(server)}",
            f"leader:{(node.leader if node is not None else None) or ''}", f"epoch:{'' if epoch is None else epoch}",
            f"applied_position:{applied or ''}", f"applied_records:{machine.index}",
            f"lag_entries:{'' if lag is None else lag}",
            f"lag_ms:{0 if leading or not lag else max(0, now - machine.stamp)}",
            f"last_apply_seconds_ago:{time.monotonic() - machine.last_apply:.3f}",
            f"lease_valid:{int(node is not None and node.lease_valid)}",
            f"read_barriers:{server.reads.barriers}",
            f"walkit_health:{health(node)}", f"walkit_trouble:{(node.trouble if node is not None else None) or ''}",
            *([] if leading else [f"master_host:{host}", f"master_port:{port}",
                                  f"master_link_status:{'up' if host and server.ready else 'down'}"]),
            f"master_repl_offset:{machine.index}", f"cluster:{server.cluster}"],
        "persistence": [f"loading:{int(server.ping_error() is not None)}", "aof_enabled:1", f"snapshots:{machine.snapshots}",
                        f"snapshot_position:{snapshot_position or ''}", f"snapshot_every:{server.snapshot_every}"],
        "stats": [f"acl_access_denied_auth:{server.auth_failures}"],
        "keyspace": [f"db0:keys={keys},expires={expires},avg_ttl=0"],
    }
    wanted = [s for s in sections if s in parts] or list(parts)
    if sections and not any(s in parts or s in ("all", "default", "everything") for s in sections):
        wanted = []
    return "".join(f"# {name.capitalize()}\r\n" + "\r\n".join(parts[name]) + "\r\n\r\n" for name in wanted)
