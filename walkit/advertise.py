"""walkit.advertise decides the address a server publishes in the metadata store.

A server listens on an interface (`--host`, e.g. 0.0.0.0 for every interface) and publishes
the address other processes dial (`--advertise HOST[:PORT]`, BookKeeper's advertisedAddress).
The two differ on any machine with more than one interface, in containers and behind NAT, so:

- `--advertise` given: it is published (its port defaults to the port listened on); a
  wildcard there (0.0.0.0, ::) is refused, since nobody can dial it.
- listening on a wildcard without `--advertise`: 127.0.0.1:PORT is published when the metadata
  store is local (SQLite, memory, or ZooKeeper/etcd on loopback addresses only, so every client
  is on this machine); otherwise the server refuses to start and says to set `--advertise`.
- listening on a loopback address while the metadata store is on another machine: refused, for
  the same reason (clients elsewhere would dial their own machine).

    address = advertised_address("0.0.0.0", 3181, "10.0.0.5", "zk://10.0.0.2:2181/walkit")  # "10.0.0.5:3181"
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from walkit.errors import ConfigError

WILDCARDS = {"0.0.0.0", "::", "*", ""}
LOCAL_SCHEMES = {"sqlite", "memory"}


def split_host_port(address: str) -> tuple[str, int | None]:
    """split_host_port parses HOST, HOST:PORT, [V6] or [V6]:PORT; ConfigError if malformed."""
    text = address.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"{address!r} is not HOST, HOST:PORT or [IPV6]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, None                      # a bare IPv6 address or a host name
    if port_text is None:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{address!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    """join_host_port is HOST:PORT, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_wildcard(host: str) -> bool:
    """is_wildcard tells whether `host` means every interface (nobody can dial it)."""
    return host.strip("[]") in WILDCARDS


def is_loopback(host: str) -> bool:
    """is_loopback tells whether `host` is this machine only (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def metadata_is_local(metadata_url: str) -> bool:
    """metadata_is_local tells whether every client of this metadata store runs on this machine."""
    parts = urlsplit(metadata_url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    netloc = parts.netloc.rpartition("@")[2]              # drop user:password@
    hosts = [split_host_port(item)[0] for item in netloc.split(",") if item]
    return bool(hosts) and all(is_loopback(host) for host in hosts)


def advertised_address(host: str, port: int, advertise: str | None, metadata_url: str, *,
                       what: str = "this server") -> str:
    """advertised_address is the HOST:PORT to publish (see the module doc); ConfigError when none fits."""
    if advertise:
        advertised_host, advertised_port = split_host_port(advertise)
        if is_wildcard(advertised_host):
            raise ConfigError(f"--advertise {advertise}: {what} must publish an address others can dial, "
                              f"not a wildcard; give this machine's address or name")
        return join_host_port(advertised_host, advertised_port or port)
    local = metadata_is_local(metadata_url)
    if is_wildcard(host):
        if local:
            return join_host_port("127.0.0.1", port)
        raise ConfigError(f"{what} listens on every interface ({join_host_port(host, port)}) and its metadata store "
                          f"is on another machine: set --advertise HOST[:PORT] to the address clients there dial")
    if is_loopback(host) and not local:
        raise ConfigError(f"{what} listens on {join_host_port(host, port)}, which only this machine can dial, but its "
                          f"metadata store is on another machine: set --host to an address others reach (or "
                          f"--host 0.0.0.0 with --advertise HOST[:PORT])")
    return join_host_port(host, port)
