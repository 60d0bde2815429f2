"""Server commands against a real redis-server: CLIENT REPLY, CONFIG SET, INFO's redis_version, HELLO 3."""

from __future__ import annotations

import re


def test_client_reply_off_and_skip_send_nothing_and_on_sends_again(redis_pair):
    redis_pair.reset()
    script = (b"CLIENT REPLY OFF\r\nSET a 1\r\nINCR a\r\nCLIENT REPLY SKIP\r\nGET a\r\nGET a\r\n"
              b"CLIENT REPLY ON\r\nGET a\r\nCLIENT REPLY SKIP\r\nCLIENT REPLY ON\r\nGET nosuch\r\n")
    got = {}
    for name, reader in redis_pair.readers.items():
        reader.sock.sendall(script)
        got[name] = [reader.read() for _ in range(4)]

    assert got["walkit"] == got["redis"]
    redis_pair.same([b"PING"])                          # and nothing else was sent
    assert got["walkit"] == [b"+OK\r\n", b"$1\r\n2\r\n", b"+OK\r\n", b"$-1\r\n"]


def test_config_set_changes_nothing_and_says_so(redis_pair):
    redis_pair.reset()
    redis_pair.same([b"CONFIG", b"SET", b"no-such-parameter", b"1"], [b"CONFIG", b"SET", b"maxmemory"],
                    [b"CONFIG", b"GET", b"maxmemory"], [b"CONFIG", b"SET", b"maxmemory", b"0"])
    got = redis_pair.send(b"CONFIG", b"SET", b"maxmemory", b"100mb")
    assert got["redis"] == b"+OK\r\n"                  # redis changes it; walkit refuses, never a silent OK
    assert got["walkit"].startswith(b"-ERR walkit kv does not change 'maxmemory' at run time")
    redis_pair.send(b"CONFIG", b"SET", b"maxmemory", b"0")
    assert redis_pair.send(b"CONFIG", b"SET", b"requirepass", b"secret")["walkit"].startswith(
        b"-ERR walkit kv takes passwords and users only at start")
    redis_pair.send(b"CONFIG", b"SET", b"requirepass", b"")


def test_info_names_the_redis_release_whose_replies_walkit_matches(redis_pair):
    versions = {name: re.search(rb"redis_version:(\S+)", reply).group(1)
                for name, reply in redis_pair.send(b"INFO", b"server").items()}
    assert versions["walkit"] == versions["redis"]


def test_hello_3_switches_both_to_resp3(redis_pair):
    redis_pair.reset()
    for name, reply in redis_pair.send(b"HELLO", b"3").items():
        assert reply.startswith(b"%7\r\n"), (name, reply)
    redis_pair.same([b"SET", b"k", b"v"], [b"GET", b"nosuch"], [b"MULTI"], [b"GET", b"k"], [b"EXEC"],
                    [b"CONFIG", b"GET", b"maxmemory"], [b"CLIENT", b"GETNAME"], [b"INCR", b"k"], [b"WATCH", b"k"],
                    [b"CLIENT", b"SETNAME", b"x"], [b"CLIENT", b"GETNAME"])
