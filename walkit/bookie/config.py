"""walkit.bookie.config is a bookie's configuration: defaults, a TOML file, command-line flags.

    # bookie.toml (keys may also sit under a [bookie] table)
    metadata = "zk://127.0.0.1:2181/walkit"
    storage = "files:///var/lib/walkit/bookie"
    port = 3181
    group_wait_ms = 1.0

`walkit bookie --config bookie.toml --port 3182` reads the file, then applies the flags given on
the command line. Every value is checked at start-up; a bad one is a ConfigError naming the key
and what it must be, and the bookie does not start.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields

from walkit.advertise import split_host_port
from walkit.errors import ConfigError
from walkit.registry import valid_bookie_id
from walkit.wire.codec import DEFAULT_MAX_FRAME, DEFAULT_MAX_REQUESTS


def _positive(value) -> bool:
    return value > 0


def _fraction(value) -> bool:
    return 0 < value <= 1


#: Per key: (type, check, what the check requires) for values read from files and flags.
_RULES = {
    "metadata": (str, lambda v: "://" in v, "a metadata URI such as sqlite:///path or zk://host:port/root"),
    "storage": (str, lambda v: "://" in v, "a storage URI such as files:///dir"),
    "host": (str, bool, "an interface address such as 127.0.0.1"),
    "port": (int, lambda v: 0 <= v <= 65535, "a TCP port in 0..65535"),
    "advertise": (str, lambda v: True, "HOST or HOST:PORT, the address clients dial"),
    "listen": (str, lambda v: True, "HOST:PORT, the interface and port to listen on"),
    "bookie_id": (str, lambda v: not v or valid_bookie_id(v),
                  "letters, digits and . _ - : [ ] only, at most 255 characters (or empty: the advertised address)"),
    "max_frame_bytes": (int, lambda v: v >= 1024, "at least 1024"),
    "max_requests_per_frame": (int, _positive, "a positive number of requests"),
    "max_long_poll_ms": (int, _positive, "a positive number of milliseconds"),
    "max_long_polls": (int, _positive, "a positive number of long polls"),
    "max_batch_frames": (int, _positive, "a positive number of frames"),
    "max_batch_bytes": (int, lambda v: v >= 1024, "at least 1024 bytes"),
    "group_wait_ms": (float, lambda v: 0 <= v <= 1000, "between 0 and 1000 ms"),
    "group_max_entries": (int, _positive, "a positive number of entries"),
    "gc_interval_s": (float, _positive, "a positive number of seconds"),
    "disk_usage_threshold": (float, _fraction, "a fraction in (0, 1]"),
    "disk_usage_lwm": (float, _fraction, "a fraction in (0, 1]"),
    "disk_check_interval_s": (float, _positive, "a positive number of seconds"),
    "disk_min_free_mb": (float, lambda v: v >= 0, "zero or more megabytes"),
    "register_timeout_s": (float, lambda v: v >= 0, "zero or more seconds"),
    "tick_ms": (int, _positive, "a positive number of milliseconds"),
    "curve_key": (str, lambda v: True, "the path of the bookie's NAME.key_secret file (`walkit keys new`)"),
    "rack": (str, lambda v: len(v) <= 256 and v.isprintable(), "a printable rack or zone name (at most 256 characters)"),
    "http_port": (int, lambda v: -1 <= v <= 65535, "a TCP port in 0..65535 (0: any free port), or -1 for none"),
    "autorecovery": (bool, lambda v: True, "true or false"),
    "lost_bookie_delay": (float, lambda v: v >= 0, "zero or more seconds"),
    "open_ledger_grace": (float, lambda v: v >= 0, "zero or more seconds"),
    "audit_rate": (float, _positive, "a positive number of metadata reads per second"),
    "periodic_check_interval": (float, lambda v: v >= 0, "zero (never) or more seconds"),
    "verify_fraction": (float, lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),
    "recovery_passwords": (list, lambda v: all(isinstance(p, str) for p in v), "a list of ledger passwords (strings)"),
    "min_racks": (int, _positive, "a positive number of racks"),
}


@dataclass(slots=True)
class BookieConfig:
    """BookieConfig is everything a bookie process needs.

    - `metadata`, `storage`: backend URIs (`walkit bookie` defaults to the embedded metadata
      store; storage defaults to files:// under ./walkit-data/bookie-PORT);
    - `host`, `port`: where the ROUTER socket listens (port 0 picks a free port);
    - `listen`: HOST:PORT, the same as `host` and `port` in one value (it wins over them);
    - `advertise`: HOST or HOST:PORT the bookie registers, the address clients dial (default:
      host:port; listening on 0.0.0.0 without it registers 127.0.0.1 if the metadata store is
      local and refuses to start otherwise: walkit.advertise);
    - `bookie_id`: the name ledger metadata gives this bookie (BookKeeper's BP-41 bookie id),
      mapped to the advertised address by its registration, so a bookie whose address changes
      keeps its ledgers. Default: the id its storage was formatted with, or on a new storage the
      advertised address (what every bookie was called before ids existed). Set it to a name
      (`bookie-1`) where addresses are not stable, such as containers; a storage formatted for
      another id is refused (walkit.bookie.identity);
    - `max_frame_bytes`: larger request frames get BAD_REQUEST; no answer frame is larger
      either (nor larger than the 64 MiB a client takes): a read's answer stops 64 KiB below
      it whatever the read asks, and a round's answers to one client go in as many frames as
      they need (walkit.bookie.service);
    - `max_requests_per_frame`: frames with more requests get TOO_MANY_REQUESTS (clients split
      what they send below it);
    - `max_long_poll_ms`: longer long-poll timeouts are shortened to this;
    - `max_long_polls`: long polls waiting at once; one more gets TOO_MANY_REQUESTS;
    - group commit (BookKeeper's journalMaxGroupWaitMSec / journalBufferedWritesThreshold):
      a round takes up to `max_batch_frames` waiting frames; if they changed storage, the
      bookie waits up to `group_wait_ms` for more until `group_max_entries` entries are
      pending, then syncs once for all of them;
    - memory backpressure: a round stops taking frames once they hold `max_batch_bytes`; the
      rest waits in the socket (at most 1000 messages per client, then TCP pushes back), so
      what a bookie holds at once is bounded however many clients write to it;
    - `gc_interval_s`: how often data of deleted ledgers is dropped and storage compacted;
    - read-only mode: past `disk_usage_threshold` of its disk in use, or with less than
      `disk_min_free_mb` free, the bookie refuses adds (READ_ONLY) and registers as read-only;
      below `disk_usage_lwm` with twice `disk_min_free_mb` free it is writable again; checked
      at start (before it registers) and every `disk_check_interval_s`. A bookie restarted on a
      full disk registers read-only (the files storage needs a little room to open: it writes a
      checkpoint). A disk that fills between two checks fails the journal's write: the bookie
      stops (a storage failure), with no acknowledged entry lost;
    - `register_timeout_s`: how long start-up waits for a dead predecessor's registration;
    - `tick_ms`: the longest the serving loop waits for requests before it runs its timers
      (long-poll deadlines, the next garbage collection);
    - `curve_key`: this bookie's CurveZMQ key pair (a NAME.key_secret file): the bookie then
      accepts only clients on the allow-list, authenticated, and checks their rights per ledger
      (walkit.security); empty: no security;
    - `rack`: the rack or zone the bookie registers with (walkit.placement);
    - `http_port`: where GET /metrics, /health and /ready are served (0: a free port; -1: not
      at all); the bookie registers the address;
    - auto-recovery (walkit.autorecovery): `autorecovery` runs an auditor candidate and a
      replication worker in the bookie; a bookie unregistered for `lost_bookie_delay` seconds
      is lost and its ledgers are re-replicated; an unclosed ledger's last fragment is left
      to its writer for `open_ledger_grace` seconds; the auditor reads at most `audit_rate`
      metadata keys per second and checks every ledger every `periodic_check_interval`
      seconds (reading `verify_fraction` of the entries besides each fragment's first and
      last); workers open ledgers with `recovery_passwords` and keep every write set on at
      least `min_racks` racks;
    - `parent_pid`: exit when that process is gone (set by LocalCluster).
    """

    metadata: str
    storage: str = ""
    host: str = "127.0.0.1"
    port: int = 3181
    advertise: str = ""
    listen: str = ""
    bookie_id: str = ""
    max_frame_bytes: int = DEFAULT_MAX_FRAME
    max_requests_per_frame: int = DEFAULT_MAX_REQUESTS
    max_long_poll_ms: int = 60_000
    max_long_polls: int = 10_000
    max_batch_frames: int = 1024
    max_batch_bytes: int = 64 * 1024 * 1024
    group_wait_ms: float = 0.0
    group_max_entries: int = 20000
    gc_interval_s: float = 60.0
    disk_usage_threshold: float = 0.95
    disk_usage_lwm: float = 0.90
    disk_check_interval_s: float = 5.0
    disk_min_free_mb: float = 64.0
    register_timeout_s: float = 30.0
    tick_ms: int = 10
    curve_key: str = ""
    rack: str = ""
    http_port: int = -1
    autorecovery: bool = True
    lost_bookie_delay: float = 60.0
    open_ledger_grace: float = 30.0
    audit_rate: float = 500.0
    periodic_check_interval: float = 86400.0
    verify_fraction: float = 0.0
    recovery_passwords: list = field(default_factory=lambda: [""])
    min_racks: int = 1
    parent_pid: int | None = None

    def __post_init__(self) -> None:
        if self.listen:
            host, port = split_host_port(self.listen)
            self.host, self.port = host.strip("[]"), self.port if port is None else port
        if not self.storage:
            self.storage = f"files://{os.path.abspath(os.path.join('walkit-data', f'bookie-{self.port}'))}"

    def validate(self) -> None:
        """validate raises ConfigError for any value the bookie cannot run with."""
        for key, (kind, check, requirement) in _RULES.items():
            value = getattr(self, key)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                setattr(self, key, value)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool) or not check(value):
                raise ConfigError(f"bookie config: {key} must be {requirement}, got {value!r}")
        if self.disk_usage_lwm > self.disk_usage_threshold:
            raise ConfigError(f"bookie config: disk_usage_lwm ({self.disk_usage_lwm}) must not exceed "
                              f"disk_usage_threshold ({self.disk_usage_threshold})")

    @classmethod
    def load(cls, path: str | None = None, defaults: dict | None = None, **overrides) -> "BookieConfig":
        """load starts from `defaults`, reads `path` (TOML) if given, applies `overrides` that are
        not None, and validates the result."""
        values: dict = {}
        if path is not None:
            try:
                with open(path, "rb") as f:
                    document = tomllib.load(f)
            except OSError as exc:
                raise ConfigError(f"cannot read bookie config {path}: {exc.strerror}") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"bookie config {path} is not valid TOML: {exc}") from None
            values = document.get("bookie", document)
            known = {f.name for f in fields(cls)} - {"parent_pid"}
            unknown = sorted(set(values) - known)
            if unknown:
                raise ConfigError(f"bookie config {path}: unknown key(s) {', '.join(unknown)}; "
                                  f"known keys: {', '.join(sorted(known))}")
        values = {**(defaults or {}), **values, **{k: v for k, v in overrides.items() if v is not None}}
        if "metadata" not in values:
            raise ConfigError("bookie config: metadata is required (--metadata, WALKIT_METADATA or the file)")
        config = cls(**values)
        config.validate()
        return config

    def recovery_config(self):
        """recovery_config is the walkit.autorecovery.RecoveryConfig these settings describe."""
        from walkit.autorecovery import RecoveryConfig
        return RecoveryConfig(lost_bookie_delay_s=self.lost_bookie_delay, open_grace_s=self.open_ledger_grace,
                              audit_rate=self.audit_rate, periodic_check_s=self.periodic_check_interval,
                              verify_fraction=self.verify_fraction, passwords=tuple(self.recovery_passwords),
                              min_racks=self.min_racks)
