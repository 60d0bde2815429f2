"""What the adversarial reviews of principal mode (tests/integration/test_principals_review*.py) share."""

from __future__ import annotations

import io
import json

from kazoo.security import ACL, Id, Permissions

from walkit.core.loglist import Position


def zk_digest(principal) -> str:
    """zk_digest is a test principal's ZooKeeper digest identity."""
    from walkit.plugins.metadata.zookeeper_principals import digest_id
    return digest_id(principal.id, principal.password)


def zk_cluster(principal, perms: int = Permissions.ALL) -> list[ACL]:
    """zk_cluster is an ACL giving the cluster's user `perms`, as a principal reads its identities (never masked)."""
    ids = json.loads(principal.raw.get(principal.path("security/principal-identities"))[0])["cluster"]
    return [ACL(perms, Id("digest", i)) for i in ids]


def publish_snapshot(client, name: str, position: Position, state: bytes):
    """publish_snapshot writes `state` as replicated name `name`'s snapshot at `position` and points the name at it."""
    from walkit.replication.snapshots import publish, write_snapshot
    written = write_snapshot(client, name, io.BytesIO(state), position, ensemble=3, write_quorum=2, ack_quorum=2)
    publish(client.store, name, written)
    return written


def wins_election(client, name: str, timeout: float) -> bool:
    """wins_election says whether `client` wins replicated name `name`'s election within `timeout` (then resigns)."""
    from walkit.election import LeaderElection
    from walkit.errors import Timeout
    election = LeaderElection(client.store, f"replication/{name}", "alice:1")
    try:
        election.campaign(timeout=timeout)
    except Timeout:
        return False
    election.resign()
    return True
