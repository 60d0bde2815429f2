"""Authentication of the metadata stores (issue 17, item 3), on real ZooKeeper and etcd servers.

ZooKeeper: a store with a user connects with its digest credential and creates every znode with
an ACL only that user passes; other clients get NoAuth, a wrong password or none is a clear
MetadataError. etcd: an etcd of this module's own, with authentication enabled, and a user whose
role may read and write ``/auth/...``; a token etcd drops is renewed without the caller noticing.
SQLite: a new file is private. Everywhere: no password in errors, logs, `uri` or repr.
"""

from __future__ import annotations

import logging
import os
import stat
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl

from walkit.errors import ConfigError, MetadataError
from walkit.plugins import open_metadata
from walkit.plugins.metadata.credentials import Credentials, redact
from walkit.plugins.metadata.session import parse_uri
from walkit.testing.metadata import MetadataStoreConformance, Recorder, StoreFactory
from walkit.testing.processes import wait_until
from walkit.testing.servers import SecuredEtcdServer, etcd_missing, with_user

from tests.conftest import fresh_root
from tests.metadata.conftest import ETCD_LEASE_S, TIMEOUT_S

slow = pytest.mark.slow

ZK_USER, ZK_PASSWORD = "walkit", "zk-s3cret/pa:ss@word"         # characters that need percent-encoding
ETCD_USER, ETCD_PASSWORD = "walkit", "etcd-s3cret"
ETCD_PREFIX = "/auth"                                            # the etcd user may read and write /auth/...
ETCD_TOKEN_TTL_S = 2
#: Longer than tests/metadata's 1.5 s: on a loaded machine kazoo drops connections that miss a
#: ping, and a next_id whose answer is lost in a drop leaves a gap the conformance suite reports.
ZK_SESSION_S = 3.0


# -- URIs, credentials and redaction (no server) -------------------------------------------------
@pytest.mark.parametrize("uri, shown", [
    ("zk://walkit:hunter2@127.0.0.1:2181/w", "zk://walkit:***@127.0.0.1:2181/w"),
    ("zk://walkit:hunter2@h1:1,h2:2/w?timeout=3", "zk://walkit:***@h1:1,h2:2/w?timeout=3"),
    ("etcd://walkit:hun%40ter2@127.0.0.1:2379/w", "etcd://walkit:***@127.0.0.1:2379/w"),
    ("etcd://walkit:hun@ter2@127.0.0.1:2379/w", "etcd://walkit:***@127.0.0.1:2379/w"),
    ("zk://walkit:hun/ter?2#x@127.0.0.1:2181/w", "zk://walkit:***@127.0.0.1:2181/w"),    # malformed: still hidden
    ("zk://walkit@127.0.0.1:2181/w?password_file=/etc/pw", "zk://walkit@127.0.0.1:2181/w?password_file=/etc/pw"),
    ("zk://127.0.0.1:2181/w", "zk://127.0.0.1:2181/w"),
    ("sqlite:///var/walkit/metadata.db", "sqlite:///var/walkit/metadata.db"),
])
def test_redact_hides_only_the_password(uri, shown):
    assert redact(uri) == shown


def test_credentials_never_show_their_password():
    credentials = Credentials("walkit", "hunter2")
    assert "hunter2" not in repr(credentials) and "hunter2" not in str(credentials)


def test_userinfo_is_percent_decoded_and_password_files_lose_their_newline(tmp_path):
    _, _, _, credentials = parse_uri("zk://wal%3Akit:p%40ss%2Fw@127.0.0.1:2181/w", "zk", {"timeout": 1.0}, {})
    assert (credentials.user, credentials.password) == ("wal:kit", "p@ss/w")
    secret = tmp_path / "password"
    secret.write_text("from the file\n")
    hosts, root, values, credentials = parse_uri(f"etcd://walkit@127.0.0.1:2379/w?password_file={secret}&timeout=2",
                                                 "etcd", {"timeout": 1.0}, {})
    assert (hosts, root, values) == (["127.0.0.1:2379"], "/w", {"timeout": 2.0})
    assert (credentials.user, credentials.password) == ("walkit", "from the file")
    _, _, _, credentials = parse_uri("etcd://walkit@127.0.0.1:2379/w", "etcd", {}, {"password_file": str(secret)})
    assert credentials.password == "from the file"


@pytest.mark.parametrize("uri, message", [
    ("zk://walkit@127.0.0.1:2181/w", "has no password"),
    ("zk://walkit:hunter2@127.0.0.1:2181/w?password_file=/nonexistent", "either in the URI or in password_file"),
    ("zk://127.0.0.1:2181/w?password_file=/nonexistent", "password_file needs a user"),
    ("zk://walkit@127.0.0.1:2181/w?password_file=/nonexistent", "cannot read the metadata password file"),
    ("zk://walkit:hunter2@127.0.0.1:2181", "names no root path"),
    ("zk://walkit:hunter2@/w", "names no host:port"),
    ("etcd://walkit:hunter2@127.0.0.1:2379/w?bogus=1", "unknown option"),
    ("etcd://walkit:hunter2@h1:1,h2:2/w", "one endpoint"),
])
def test_bad_credentials_are_config_errors_that_hide_the_password(uri, message):
    with pytest.raises(ConfigError, match=message) as error:
        open_metadata(uri)
    assert "hunter2" not in str(error.value)


def test_a_new_sqlite_metadata_file_and_its_wal_are_private(tmp_path):
    old_umask = os.umask(0o022)                       # what would make SQLite's default 0644
    try:
        with open_metadata(f"sqlite://{tmp_path}/metadata.db") as store:
            store.create("a", b"1")
            files = sorted(p.name for p in tmp_path.iterdir())
            modes = {name: stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in files}
    finally:
        os.umask(old_umask)
    assert files == ["metadata.db", "metadata.db-shm", "metadata.db-wal"]
    assert modes == dict.fromkeys(files, 0o600)


def test_an_existing_sqlite_metadata_file_keeps_its_mode(tmp_path):
    path = tmp_path / "shared.db"
    path.touch()
    path.chmod(0o640)
    with open_metadata(f"sqlite://{path}") as store:
        store.create("a", b"1")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


# -- ZooKeeper: digest user and ACLs ---------------------------------------------------------------
def zk_url(zk_server, root: str, password: str | None = ZK_PASSWORD, **options) -> str:
    """zk_url is the zk:// URI of `root` on the shared server, as user walkit with `password` (None: no user)."""
    url = zk_server.url(root, session_timeout=ZK_SESSION_S, timeout=TIMEOUT_S, **options)
    return url if password is None else with_user(url, ZK_USER, password)


@pytest.fixture
def zk_auth_factory(zk_server):
    """zk_auth_factory opens stores as user walkit on a fresh root, nested so that it has a parent to create."""
    factory = StoreFactory(zk_url(zk_server, f"{fresh_root()}/walkit"), expiry=ZK_SESSION_S)
    yield factory
    factory.close_all()


@pytest.fixture
def plain_kazoo(zk_server):
    """plain_kazoo is a kazoo client without credentials."""
    client = KazooClient(hosts=zk_server.address)
    client.start(timeout=TIMEOUT_S)
    yield client
    client.stop()
    client.close()


@slow
class TestZooKeeperWithAUserConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, zk_auth_factory):
        """metadata_store_factory opens stores as user walkit (digest credential, ACL'd znodes)."""
        return zk_auth_factory


@slow
def test_zk_znodes_of_a_user_are_closed_to_other_clients(zk_auth_factory, plain_kazoo):
    store = zk_auth_factory()
    store.create("ledgers/1", b"metadata")
    store.next_id("ledgers")
    store.register("bookies/b1", b"up")
    parent = store.root.rsplit("/", 1)[0]
    paths = [parent, store.root, f"{store.root}/ledgers/1", f"{store.root}/.counters/ledgers",
             f"{store.root}/bookies/b1"]
    for path in paths:
        with pytest.raises(NoAuthError):
            plain_kazoo.get(path)
        with pytest.raises(NoAuthError):
            plain_kazoo.set(path, b"overwritten")
    plain_kazoo.add_auth("digest", f"{ZK_USER}:{ZK_PASSWORD}")
    only_walkit = [make_digest_acl(ZK_USER, ZK_PASSWORD, all=True)]
    assert all(plain_kazoo.get_acls(path)[0] == only_walkit for path in paths)


@slow
def test_zk_a_wrong_password_or_none_is_a_clear_error_at_open(zk_auth_factory, zk_server):
    store = zk_auth_factory()
    store.create("a", b"1")
    root = store.root
    for password, hint in [("wrong", "check the user and password"), (None, "give the store their user")]:
        started = time.monotonic()
        with pytest.raises(MetadataError, match="not authorized") as error:
            open_metadata(zk_url(zk_server, root, password))
        assert hint in str(error.value)
        assert time.monotonic() - started < TIMEOUT_S                   # an answer, not a timeout
        assert ZK_PASSWORD not in str(error.value)


@slow
def test_zk_operations_refused_by_the_acl_are_clear_errors(zk_auth_factory, zk_server):
    """A store whose root did not exist yet opens; its calls on the user's znodes then fail clearly."""
    root = f"{fresh_root()}/walkit"
    intruder = open_metadata(zk_url(zk_server, root, "wrong"))
    try:
        owner = StoreFactory(zk_url(zk_server, root), expiry=ZK_SESSION_S)
        try:
            owner().create("a", b"1")
            for call in (lambda: intruder.get("a"), lambda: intruder.put("a", b"2", 0), lambda: intruder.children("a"),
                         lambda: intruder.next_id("ids"), lambda: intruder.register("bookies/b1", b"")):
                with pytest.raises(MetadataError, match="not authorized.*check the user and password"):
                    call()
        finally:
            owner.close_all()
    finally:
        intruder.close()


@slow
def test_zk_password_file_and_warning_for_a_root_made_before(zk_server, plain_kazoo, tmp_path, caplog):
    root = f"{fresh_root()}/walkit"
    plain_kazoo.create(root, b"", makepath=True)                   # open to anyone: made before the user
    secret = tmp_path / "zk-password"
    secret.write_text(ZK_PASSWORD + "\n")
    with caplog.at_level(logging.WARNING), \
            open_metadata(with_user(zk_server.url(root, password_file=secret), ZK_USER)) as store:
        store.create("a", b"1")
        with pytest.raises(NoAuthError):
            plain_kazoo.get(f"{root}/a")
    assert "existed before with ACL" in caplog.text and "setAcl -R" in caplog.text


@slow
def test_zk_password_never_shows_in_uri_repr_errors_or_logs(zk_auth_factory, zk_server, caplog):
    caplog.set_level(1)                                             # everything, kazoo's DEBUG included
    store = zk_auth_factory()
    store.create("a", b"1")
    with pytest.raises(MetadataError) as error:
        open_metadata(zk_url(zk_server, store.root, "wrong-" + ZK_PASSWORD))
    assert store.uri.startswith(f"zk://{ZK_USER}:***@")
    assert "Auth(" in caplog.text                                   # kazoo logged the auth request ...
    for text in (store.uri, repr(store), str(error.value), caplog.text):
        assert ZK_PASSWORD not in text                              # ... without the password
        assert ZK_PASSWORD.split("/")[0] not in text                # nor its unencoded start


# -- etcd: users, roles and tokens ---------------------------------------------------------------
@pytest.fixture(scope="module")
def secured_etcd():
    """secured_etcd is this module's own etcd, authentication enabled, user walkit may use /auth/..."""
    missing = etcd_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with SecuredEtcdServer(token_ttl_s=ETCD_TOKEN_TTL_S) as server:
        server.add_user(ETCD_USER, ETCD_PASSWORD, prefix=f"{ETCD_PREFIX}/")
        yield server


def etcd_url(server, root: str, password: str | None = ETCD_PASSWORD, **options) -> str:
    """etcd_url is the etcd:// URI of `root`, as user walkit with `password` (None: no user)."""
    url = server.url(root, **{"lease_ttl": ETCD_LEASE_S, "timeout": TIMEOUT_S, **options})
    return url if password is None else with_user(url, ETCD_USER, password)


@pytest.fixture
def etcd_auth_factory(secured_etcd):
    """etcd_auth_factory opens stores as user walkit on a fresh root under /auth."""
    factory = StoreFactory(etcd_url(secured_etcd, ETCD_PREFIX + fresh_root()), expiry=ETCD_LEASE_S)
    yield factory
    factory.close_all()


@slow
class TestEtcdWithAUserConformance(MetadataStoreConformance):
    @pytest.fixture
    def metadata_store_factory(self, etcd_auth_factory):
        """metadata_store_factory opens stores as user walkit on an etcd with authentication enabled."""
        return etcd_auth_factory


@slow
@pytest.mark.parametrize("root, password, message", [
    (ETCD_PREFIX + "/w", "wrong", "etcd refused user 'walkit': authentication failed"),
    (ETCD_PREFIX + "/w", None, "etcd has authentication enabled: give the store a user"),
    ("/elsewhere", ETCD_PASSWORD, "permission denied; etcd user 'walkit' has no permission on these keys: "
                                  "grant its role readwrite on the prefix /elsewhere/"),
])
def test_etcd_refusals_are_clear_errors_at_open(secured_etcd, root, password, message):
    started = time.monotonic()
    with pytest.raises(MetadataError, match=message) as error:
        open_metadata(etcd_url(secured_etcd, root, password))
    assert time.monotonic() - started < TIMEOUT_S                       # an answer, not a timeout
    assert ETCD_PASSWORD not in str(error.value) and "wrong" not in str(error.value)


@slow
def test_etcd_a_dropped_token_is_renewed_for_calls_and_watches(secured_etcd):
    """etcd drops every token of a user whose password changes; calls and a resumed watch get a new one.

    The lease is long, so its keep-alive (every 10 s) stays out of the way: the call renews the
    token the first time, the watch resuming after etcd restarts the second time.
    """
    factory = StoreFactory(etcd_url(secured_etcd, ETCD_PREFIX + fresh_root()), expiry=30, lease_ttl=30)
    try:
        store, other = factory(), factory()
        store.register("bookies/b1", b"up")
        seen = Recorder()
        store.watch("logs", seen)
        before = store._auth.authentications
        secured_etcd.change_password(ETCD_USER, ETCD_PASSWORD)      # same password: every token dropped
        assert store.create("logs/a", b"1") > 0
        assert store._auth.authentications == before + 1
        seen.wait_for("logs/a")
        secured_etcd.change_password(ETCD_USER, ETCD_PASSWORD)
        secured_etcd.restart()                                      # the watch stream breaks
        wait_until(lambda: store._auth.authentications == before + 2, TIMEOUT_S, "the resumed watch authenticated")
        mark = seen.mark()
        store.put("logs/a", b"2", store.get("logs/a")[1])
        seen.wait_for("logs/a", since=mark)
        assert other.get("bookies/b1")[0] == b"up"                  # the lease outlived the restart
    finally:
        factory.close_all()


@slow
def test_etcd_a_token_idle_past_its_ttl_is_renewed(secured_etcd):
    """With the lease renewed rarely, the store's token idles past etcd's --auth-token-ttl and expires."""
    with open_metadata(etcd_url(secured_etcd, ETCD_PREFIX + fresh_root(), lease_ttl=30)) as store:
        store.create("a", b"1")
        before = store._auth.authentications
        time.sleep(ETCD_TOKEN_TTL_S + 1.5)              # past the TTL and etcd's 1 s expiry sweep; no request meanwhile
        assert store.get("a")[0] == b"1"
        assert store._auth.authentications == before + 1


@slow
def test_etcd_password_never_shows_in_uri_repr_errors_or_logs(secured_etcd, etcd_auth_factory, tmp_path, caplog):
    caplog.set_level(1)
    secret = tmp_path / "etcd-password"
    secret.write_text(ETCD_PASSWORD + "\n")
    url = with_user(secured_etcd.url(ETCD_PREFIX + fresh_root(), password_file=secret), ETCD_USER)
    with open_metadata(url) as store:
        store.create("a", b"1")
        store.watch("a", lambda key: None)
        uri, shown = store.uri, repr(store)
    with pytest.raises(MetadataError) as error:
        open_metadata(etcd_url(secured_etcd, ETCD_PREFIX + "/w", "not-" + ETCD_PASSWORD))
    shown_uri = etcd_auth_factory().uri
    assert shown_uri.startswith(f"etcd://{ETCD_USER}:***@")
    for text in (uri, shown, shown_uri, str(error.value), caplog.text):
        assert ETCD_PASSWORD not in text
