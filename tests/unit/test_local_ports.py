"""walkit.local's port choice: no two services chosen by one process get the same port."""

from __future__ import annotations

import socket

from walkit import local
from walkit.local import LocalCluster, free_port


def test_free_port_never_returns_a_port_it_returned_lately():
    # the kernel hands an ephemeral port out again once its socket is closed: among 2,000 binds in
    # a row some repeat (two bookies of one cluster once got the same port this way)
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_free_port_returns_a_port_nobody_listens_on():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_cluster_never_chooses_a_port_one_of_its_bookies_names(tmp_path, monkeypatch):
    cluster = LocalCluster(bookies=2, data_dir=str(tmp_path), start=False)
    remembered = cluster._bookies[0].port              # e.g. a stopped bookie's port, kept in cluster.json
    answers = iter([remembered, cluster._bookies[1].port, remembered + 1 if remembered < 65535 else 1024])
    monkeypatch.setattr(local, "free_port", lambda: next(answers))
    assert cluster._unused_port() not in (cluster._bookies[0].port, cluster._bookies[1].port)
