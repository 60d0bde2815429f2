"""walkit.advertise: the address a server publishes, and the ones it refuses."""

from __future__ import annotations

import pytest

from walkit.advertise import advertised_address, metadata_is_local, split_host_port
from walkit.errors import ConfigError


@pytest.mark.parametrize("url, local", [
    ("sqlite:///var/lib/walkit/metadata.db", True),
    ("memory://", True),
    ("zk://127.0.0.1:2181/walkit", True),
    ("zk://localhost:2181,127.0.0.2:2182/walkit", True),
    ("etcd://[::1]:2379/walkit", True),
    ("zk://user:secret@127.0.0.1:2181/walkit", True),
    ("zk://10.0.0.2:2181/walkit", False),
    ("zk://127.0.0.1:2181,10.0.0.3:2181/walkit", False),
    ("etcd://metadata.internal:2379/walkit", False),
])
def test_a_store_is_local_only_when_every_host_is_loopback(url, local):
    assert metadata_is_local(url) is local


@pytest.mark.parametrize("host, port, advertise, url, published", [
    ("127.0.0.1", 3181, "", "sqlite:///m.db", "127.0.0.1:3181"),
    ("0.0.0.0", 3181, "", "zk://127.0.0.1:2181/w", "127.0.0.1:3181"),
    ("0.0.0.0", 3181, "10.0.0.5", "zk://10.0.0.2:2181/w", "10.0.0.5:3181"),
    ("0.0.0.0", 3181, "bookie-1.internal:4000", "zk://10.0.0.2:2181/w", "bookie-1.internal:4000"),
    ("10.0.0.5", 3181, "", "zk://10.0.0.2:2181/w", "10.0.0.5:3181"),
    ("::", 3181, "[fd00::5]", "etcd://[fd00::2]:2379/w", "[fd00::5]:3181"),
])
def test_the_published_address(host, port, advertise, url, published):
    assert advertised_address(host, port, advertise, url) == published


@pytest.mark.parametrize("host, advertise, url, says", [
    ("0.0.0.0", "", "zk://10.0.0.2:2181/w", "set --advertise"),
    ("::", "", "etcd://10.0.0.2:2379/w", "set --advertise"),
    ("127.0.0.1", "", "zk://10.0.0.2:2181/w", "only this machine can dial"),
    ("0.0.0.0", "0.0.0.0", "sqlite:///m.db", "not a wildcard"),
    ("0.0.0.0", "host:0", "sqlite:///m.db", "port must be"),
    ("0.0.0.0", "host:http", "sqlite:///m.db", "port must be"),
    ("0.0.0.0", "[fd00::5", "sqlite:///m.db", "is not HOST"),
])
def test_addresses_nobody_could_dial_are_refused_with_the_fix(host, advertise, url, says):
    with pytest.raises(ConfigError, match=says):
        advertised_address(host, 3181, advertise, url)


def test_host_port_parsing():
    assert split_host_port("10.0.0.5") == ("10.0.0.5", None)
    assert split_host_port("10.0.0.5:99") == ("10.0.0.5", 99)
    assert split_host_port("[::1]:99") == ("::1", 99)
    assert split_host_port("fd00::5") == ("fd00::5", None)
