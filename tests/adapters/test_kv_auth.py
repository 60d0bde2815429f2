"""Passwords and users of `walkit kv serve` (issue 17, item 4): redis-server 7's AUTH, HELLO AUTH and NOAUTH.

In-process servers (kv_nodes) cover the protocol; two real processes cover the command line,
redis-cli -a / --user --pass, redis-py, the environment variable and the log.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import re
import subprocess
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from walkit.adapters.kv import auth
from walkit.adapters.kv import server as kv_server
from walkit.adapters.kv.auth import BadUsers, Users, load_users, parse_acl
from tests.support.resp_fuzz import Error, RawConnection, command

from ..integration.helpers import child_pids, wait_until
from tests.support.serverprocess import KVProcess, require_redis_cli

NOAUTH = Error("NOAUTH Authentication required.")
WRONGPASS = Error("WRONGPASS invalid username-password pair or user is disabled.")
ACL = "# a comment\nuser bob off >builder\nuser carol on >\"sea shell\" ~* &* +@all\n"


@pytest.fixture
def secured(kv_nodes):
    """secured is a leading in-process server: default's password s3cret, alice's wonder, carol's 'sea shell', bob off."""
    node = kv_nodes()
    node.server.users = Users.configure(requirepass="s3cret", users=[("alice", "wonder")], acl_text=ACL)
    wait_until(lambda: node.is_leader, 30, message="the node leads")
    return node


#: redis-py (8.x) retries a refused login 3 times with backoff (its AuthenticationError is a ConnectionError),
#: about 5 s a refusal: the refusals below are asked once.
ONCE = Retry(NoBackoff(), 0)


def connect(node) -> RawConnection:
    return RawConnection(node.port)


def test_before_auth_every_command_but_auth_hello_and_quit_is_answered_noauth(secured):
    with connect(secured) as conn:
        for args in [(b"PING",), (b"GET", b"k"), (b"SET", b"k", b"v"), (b"INFO",), (b"NOSUCH", b"x"),
                     (b"CLIENT", b"LIST"), (b"CONFIG", b"GET", b"*"), (b"SELECT", b"0"), (b"COMMAND",), (b"DEL", b"k")]:
            assert conn.call(*args) == NOAUTH, args
        conn.send(b"PING\r\n")                                    # inline commands too
        assert conn.read() == NOAUTH
        assert conn.call(b"QUIT") == b"OK" and conn.closed_by_server()
    with connect(secured) as conn:
        assert conn.call(b"AUTH", b"s3cret") == b"OK"
        assert conn.call(b"EXISTS", b"k") == 0                    # the SET above changed nothing


def test_auth_password_logs_in_default_and_auth_user_password_a_named_user(secured):
    for credentials, user in [((b"s3cret",), "default"), ((b"default", b"s3cret"), "default"),
                              ((b"alice", b"wonder"), "alice"), ((b"carol", b"sea shell"), "carol")]:
        with connect(secured) as conn:
            assert conn.call(b"AUTH", *credentials) == b"OK"
            assert f" user={user} ".encode() in conn.call(b"CLIENT", b"INFO")
            assert conn.call(b"SET", f"by:{user}".encode(), b"v") == b"OK" and conn.call(b"PING") == b"PONG"


def test_wrong_credentials_get_wrongpass_and_leave_the_connection_as_it_was(secured):
    with connect(secured) as conn:
        for credentials in [(b"wrong",), (b"alice", b"s3cret"), (b"nobody", b"wonder"), (b"bob", b"builder"),
                            (b"default", b""), (b"carol", b"sea")]:
            assert conn.call(b"AUTH", *credentials) == WRONGPASS, credentials
            assert conn.call(b"GET", b"k") == NOAUTH
        assert conn.call(b"AUTH", b"a", b"b", b"c") == Error("ERR syntax error")
        assert conn.call(b"AUTH", b"alice", b"wonder") == b"OK"
        assert conn.call(b"AUTH", b"alice", b"nope") == WRONGPASS
        assert b" user=alice " in conn.call(b"CLIENT", b"INFO")  # still alice
        assert conn.call(b"INFO", b"stats") == b"# Stats\r\nacl_access_denied_auth:7\r\n\r\n"


def test_a_failed_auth_is_answered_late_and_holds_only_its_own_connection(secured):
    failures = 20
    with connect(secured) as guesser, connect(secured) as other:
        started = time.monotonic()
        guesser.send(command(b"AUTH", b"guess") * failures + command(b"PING"))   # pipelined guesses
        assert other.call(b"AUTH", b"s3cret") == b"OK" and other.call(b"PING") == b"PONG"
        other_done = time.monotonic() - started
        assert guesser.read(failures) == [WRONGPASS] * failures and guesser.read() == NOAUTH
        took = time.monotonic() - started
        assert took >= failures * auth.FAILED_AUTH_DELAY_S
        assert other_done < took / 2


def test_hello_3_auth_logs_in_and_switches_to_resp3_only_when_the_credentials_are_right(secured):
    with connect(secured) as conn:
        assert conn.call(b"HELLO", b"3").startswith("NOAUTH HELLO must be called with the client already authenticated")
        assert conn.call(b"HELLO", b"3", b"AUTH", b"alice", b"wrong", b"SETNAME", b"x") == WRONGPASS
        conn.send(command(b"AUTH", b"alice", b"wonder") + command(b"GET", b"missing"))
        assert conn.read(2) == [b"OK", None]
        conn.send(command(b"CLIENT", b"GETNAME"))
        assert conn.sock.recv(100) == b"$-1\r\n"                 # RESP2 still, no name: the failed HELLO changed nothing
    with connect(secured) as conn:
        reply = conn.call(b"HELLO", b"3", b"AUTH", b"alice", b"wonder", b"SETNAME", b"app")
        assert dict(zip(reply[::2], reply[1::2]))[b"proto"] == 3
        conn.send(command(b"GET", b"missing"))
        assert conn.sock.recv(100) == b"_\r\n"                   # the RESP3 null
        assert b" name=app db=0 user=alice resp=3" in conn.call(b"CLIENT", b"INFO")


def test_redis_py_logs_in_with_password_and_with_username(secured):
    assert secured.redis(password="s3cret").set("py", "1")
    assert secured.redis(username="alice", password="wonder").get("py") == b"1"
    assert secured.redis(username="alice", password="wonder", protocol=3).get("py") == b"1"      # HELLO 3 AUTH
    with pytest.raises(redis.AuthenticationError):
        secured.redis(retry=ONCE).get("py")
    with pytest.raises(redis.AuthenticationError):
        secured.redis(password="wrong", retry=ONCE).get("py")
    with pytest.raises(redis.AuthenticationError):
        secured.redis(username="bob", password="builder", retry=ONCE).get("py")                            # off


def test_unauthenticated_connections_get_redis_lower_protocol_limits(secured):
    with connect(secured) as conn:
        conn.send(command(*[b"x"] * 11))
        assert conn.read() == Error("ERR Protocol error: unauthenticated multibulk length") and conn.closed_by_server()
    with connect(secured) as conn:
        conn.send(b"*2\r\n$4\r\nAUTH\r\n$16385\r\n")
        assert conn.read() == Error("ERR Protocol error: unauthenticated bulk length") and conn.closed_by_server()
    with connect(secured) as conn:
        assert conn.call(b"AUTH", b"s3cret") == b"OK"
        big = b"v" * 100_000
        assert conn.call(b"MSET", *[b"k%d" % i for i in range(4)], b"a", big, b"b", big, b"c", big) == b"OK"
        assert conn.call(b"GET", b"b") == big


def test_a_server_without_passwords_answers_auth_as_redis_server_does(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 30)
    with connect(node) as conn:
        assert conn.call(b"PING") == b"PONG"
        assert conn.call(b"AUTH", b"anything") == Error(
            "ERR AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?")
        assert conn.call(b"AUTH", b"default", b"anything") == b"OK"           # default takes any password
        assert conn.call(b"AUTH", b"alice", b"anything") == WRONGPASS
    assert node.redis().ping()


def test_users_without_a_default_password_refuse_anonymous_connections(kv_nodes):
    node = kv_nodes()
    node.server.users = Users.configure(users=[("alice", "wonder")])
    wait_until(lambda: node.is_leader, 30)
    with connect(node) as conn:
        assert conn.call(b"PING") == NOAUTH
        assert conn.call(b"AUTH", b"wonder") == WRONGPASS                   # default is off
        assert conn.call(b"AUTH", b"alice", b"wonder") == b"OK" and conn.call(b"PING") == b"PONG"
    node.server.users = Users.configure(users=[("alice", "wonder")], acl_text="user default on nopass")
    with connect(node) as conn:
        assert conn.call(b"PING") == b"PONG"


def test_the_acl_file_subset():
    hashed = hashlib.sha256(b"hashed pw").hexdigest()
    users = Users.configure(acl_text=f"""
        user alice on >one >two ~* &* +@all
        user carol on #{hashed}
        user dave on nopass
        user erin on >"two words" >'it\\'s'
        user fred on >gone <gone >kept
        user gina on >x resetpass >y
        user hank on >z reset
        user default on >anon allkeys allchannels allcommands
        """)
    assert users.required and users.names == ["alice", "carol", "dave", "default", "erin", "fred", "gina", "hank"]
    accepted = [(b"alice", b"one"), (b"alice", b"two"), (b"carol", b"hashed pw"), (b"dave", b"anything"),
                (b"erin", b"two words"), (b"erin", b"it's"), (b"fred", b"kept"), (b"gina", b"y"), (b"default", b"anon")]
    refused = [(b"alice", b"three"), (b"carol", hashed.encode()), (b"fred", b"gone"), (b"gina", b"x"), (b"hank", b"z"),
               (b"nobody", b"one")]
    assert all(users.authenticate(*pair) == pair[0].decode() for pair in accepted)
    assert not any(users.authenticate(*pair) for pair in refused)


@pytest.mark.parametrize("text, message", [
    ("user alice on >hunter2 ~cache:*", "line 1: rule '~cache:*' is not supported"),
    ("user alice on >hunter2 +get", "rule '+get' is not supported"),
    ("user alice on >hunter2 -@all", "rule '-@all' is not supported"),
    ("user alice on >hunter2 (~* +get)", "rule '(~*' is not supported"),
    ("\nuser alice on >hunter2\nuser alice on >hunter2", "line 3: user 'alice' is defined more than once"),
    ("alice on >hunter2", "line 1: lines are 'user NAME RULE...'"),
    ("user alice on >\"hunter2", "line 1: unbalanced quotes"),
    ("user alice on #hunter2", "a #HASH rule needs the 64 hex digits"),
    ("user al:ice on >hunter2", "a user name is 1-128 printable characters"),
])
def test_acl_files_with_rules_walkit_kv_cannot_honour_are_refused_without_quoting_passwords(text, message):
    with pytest.raises(BadUsers, match=re.escape(message)) as caught:
        Users.configure(acl_text=text)
    assert "hunter2" not in str(caught.value)


def test_the_options_of_walkit_kv_serve(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from a file\n")
    acl = tmp_path / "users.acl"
    acl.write_text(ACL)
    users = load_users(requirepass_file=str(secret), users=["alice:won:der"], acl_file=str(acl))
    assert users.authenticate(b"default", b"from a file") == "default"
    assert users.authenticate(b"alice", b"won:der") == "alice"            # the password keeps its ':'
    assert users.authenticate(b"carol", b"sea shell") == "carol"
    with pytest.raises(BadUsers, match="not both"):
        load_users(requirepass="x", requirepass_file=str(secret))
    with pytest.raises(BadUsers, match="defined more than once"):
        load_users(requirepass="x", users=["default:y"])
    with pytest.raises(BadUsers, match="--user takes NAME:PASSWORD") as caught:
        load_users(users=["justapassword"])
    assert "justapassword" not in str(caught.value)
    with pytest.raises(BadUsers, match="empty"):
        load_users(requirepass="")
    assert not load_users().required


def test_passwords_are_kept_as_digests_and_compared_in_constant_time(monkeypatch):
    users = Users.configure(requirepass="s3cret", acl_text="user alice on >first-pw >second-pw\nuser bob off >three")
    kept = pickle.dumps(users)
    assert not any(secret in kept for secret in (b"s3cret", b"first-pw", b"second-pw", b"three"))
    assert "s3cret" not in repr(users)
    calls = []

    def counting(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for name, password, compared in [(b"alice", b"first-pw", 2), (b"alice", b"wrong", 2), (b"nobody", b"x", 1),
                                     (b"bob", b"three", 1), (b"default", b"s3cret", 1)]:
        calls.clear()
        users.authenticate(name, password)
        assert calls == [(32, 32)] * compared, name                  # every password, no early exit


def test_info_client_list_config_and_the_log_never_show_passwords(secured, caplog, monkeypatch):
    monkeypatch.setattr(kv_server, "AUTH_WARNING_EVERY_S", 0.0)                       # log every failure
    with caplog.at_level(logging.WARNING, logger="walkit.adapters.kv"):
        with connect(secured) as conn:
            assert conn.call(b"AUTH", b"alice", b"s3cret") == WRONGPASS               # a known user
        with connect(secured) as conn:
            assert conn.call(b"AUTH", b"wonder", b"s3cret") == WRONGPASS              # a password typed as the user
    assert "failed AUTH from 127.0.0.1:" in caplog.text and "as user 'alice'" in caplog.text
    assert "as an unknown user" in caplog.text
    r = secured.redis(password="s3cret")
    shown = [r.execute_command("INFO", "everything"), r.execute_command("CLIENT", "LIST"),
             str(r.config_get("*")), caplog.text]
    for text in map(repr, shown):
        assert not any(secret in text for secret in ("s3cret", "wonder", "sea shell", "builder")), text
    with pytest.raises(redis.ResponseError, match="takes passwords and users only at start"):
        r.config_set("requirepass", "new")
    assert secured.redis(password="s3cret").ping()


# -- real processes -----------------------------------------------------------------------------
def cli(port: int, *args: str) -> subprocess.CompletedProcess:
    """cli runs redis-cli against the server and returns what it did."""
    require_redis_cli()
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)


def serving(server: KVProcess, **credentials) -> None:
    """serving waits until the server leads, logging in with `credentials`."""
    def leads():
        assert server.process.poll() is None, server.log_tail()
        return server.redis(socket_timeout=5, retry=ONCE, **credentials).execute_command("ROLE")[0] == b"master"
    wait_until(leads, 60, message=lambda: server.log_tail())
    server.bookies |= set(child_pids(server.process.pid))


@pytest.mark.slow
def test_redis_cli_and_redis_py_log_in_to_a_walkit_kv_serve_process(tmp_path):
    (tmp_path / "secret").write_text("s3cret\n")
    (tmp_path / "users.acl").write_text(ACL)
    server = KVProcess(tmp_path, data_dir=tmp_path / "data", args=(
        "--bookies", "1", "--requirepass-file", str(tmp_path / "secret"), "--user", "alice:wonder",
        "--acl-file", str(tmp_path / "users.acl")))
    server.start()
    try:
        serving(server, password="s3cret")
        assert cli(server.port, "-a", "s3cret", "SET", "greeting", "hello").stdout.strip() == "OK"
        assert cli(server.port, "--user", "alice", "--pass", "wonder", "GET", "greeting").stdout.strip() == "hello"
        assert cli(server.port, "--user", "carol", "--pass", "sea shell", "INCR", "n").stdout.strip() == "1"
        assert cli(server.port, "-3", "--user", "alice", "--pass", "wonder", "GET", "greeting").stdout.strip() \
            == "hello"                                                              # HELLO 3 AUTH
        assert cli(server.port, "GET", "greeting").stdout.strip() == "NOAUTH Authentication required."
        denied = server.redis(password="s3cret").info("stats")["acl_access_denied_auth"]
        wrong = cli(server.port, "-a", "wrong", "GET", "greeting")
        assert "WRONGPASS" in wrong.stderr and "NOAUTH" in wrong.stdout
        assert server.redis(password="s3cret").info("stats")["acl_access_denied_auth"] == denied + 1
        assert server.redis(password="s3cret").get("greeting") == b"hello"
        assert server.redis(username="alice", password="wonder", protocol=3).incr("n") == 2
        with pytest.raises(redis.AuthenticationError):
            server.redis(username="bob", password="builder", retry=ONCE).get("n")
        info = server.redis(password="s3cret").info("everything")
    finally:
        server.stop()
    with open(server.log_path) as f:
        log = f.read()
    assert "serving RESP" in log and "--askpass" in log and "failed AUTH" in log
    assert not any(secret in log + repr(info) for secret in ("s3cret", "wonder", "sea shell", "builder")), log


@pytest.mark.slow
def test_the_password_can_come_from_the_environment_and_stays_off_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("WALKIT_KV_REQUIREPASS", "from the env")
    server = KVProcess(tmp_path, data_dir=tmp_path / "data", args=("--bookies", "1"))
    server.start()
    try:
        serving(server, password="from the env")
        with open(f"/proc/{server.process.pid}/cmdline", "rb") as f:
            assert b"from the env" not in f.read()
        assert cli(server.port, "PING").stdout.strip() == "NOAUTH Authentication required."
        assert cli(server.port, "-a", "from the env", "--no-auth-warning", "PING").stdout.strip() == "PONG"
    finally:
        server.stop()
