"""walkit.adapters.sqlite.forwarding carries a follower's write transactions to the leader, which runs them as its own.

A connection on a node that does not lead (`connect(..., forward_writes=True)`, the default)
sends its write transaction to the leader's process: from its first write statement to its
COMMIT or ROLLBACK, every statement of the transaction runs there, on a connection of the
leader's (`_Session`), exactly as a local transaction of the leader runs (the file's write
lock, the Session capturing the changeset, the trial apply before the record is appended:
walkit.adapters.sqlite.connection and machine). The follower gets each statement's rows,
rowcount and lastrowid, so the transaction reads its own writes; COMMIT returns once the
leader committed and this node applied the record (read-your-writes on the node that wrote).

    follower (Forwarder)                         leader (Server: one _Session per channel)
    first write  ── run {begin?, sql, params} ──►  BEGIN, write lock, check read_at, run it
    statements   ── run {sql, params} ─────────►   run it (reads too: the writes are there)
    COMMIT       ── commit ────────────────────►   commit: trial, append, apply ─► position P
    returns once this node's file applied P  ◄──

The channel (walkit.adapters.sqlite.channel) is TCP with frames of JSON. The leader listens
on `forward_address` (default: 127.0.0.1 when the metadata store is on this machine,
walkit.advertise) and publishes its address and a random key under
``sqlite/<name>/forward/<node_id>`` (ephemeral); a follower proves it holds the key (an HMAC
of a nonce) before anything runs. So a process that can read the cluster's metadata can forward writes, which on a
cluster without keys it can append to the log anyway. A secured cluster (CurveZMQ keys and
ACLs, walkit.security) decides who may write by key; this channel does not check keys, so
nodes there serve no forwarding and a follower's write raises NotLeader saying so.

Exactly once: a request is sent once on one channel and answered once; a request that may
have run is never sent again. Only a request the leader refused before running anything (it
does not lead) goes again, to the new leader. A channel that breaks in a transaction ends it
(the leader rolls it back: OperationalError); one that breaks while a commit may be under way
raises CommitFailed: the transaction may or may not be in the log, as when a leader's own
COMMIT loses the log's answer.

Isolation: statements a transaction ran on the follower before its first write read the
follower's copy. If the leader applied a record that copy had not (the reads were not of the
latest state), the write fails with "database is locked" (SQLITE_BUSY_SNAPSHOT), as a SQLite
read transaction does when it tries to write after another connection wrote: roll back and
run the transaction again.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from walkit.advertise import is_wildcard, join_host_port, metadata_is_local, split_host_port
from walkit.errors import ConfigError, NoSuchKey, WalkitError

from walkit.adapters.sqlite import errors
from walkit.adapters.sqlite import statements as st
from walkit.adapters.sqlite.channel import (
    as_error, endpoint_key, error_doc, proof, read_parameters, receive, secured, send, verify, wire_parameters,
)
from walkit.adapters.sqlite.connection import Connection
from walkit.adapters.sqlite.errors import CommitFailed, OperationalError

log = logging.getLogger("walkit.adapters.sqlite")

#: How long a follower waits for the leader's first frame (the nonce) and a leader for the proof.
HANDSHAKE_S = 5.0
#: How often a follower waiting for an answer looks whether the leader it waits for still leads.
POLL_S = 0.5
#: How long the leader keeps a forwarded transaction open with no request from its follower (it
#: holds the file's write lock): then it rolls it back and closes the channel.
IDLE_S = 60.0


# -- the leader's side ----------------------------------------------------------------------------------
def serve(database, address: str | bool | None):
    """serve starts the Server of `database`'s forwarded writes, or returns why it does not (a str).

    `address` is connect's `forward_address`: "HOST[:PORT]" to listen on and publish, False
    for none, None for 127.0.0.1 on a cluster whose metadata store is on this machine.
    """
    if address is False:
        return "it was started with forward_address=False"
    if secured(database.client):
        return ("the cluster is secured (CurveZMQ keys): forwarded writes would bypass the log's ACLs, so nodes "
                "of a secured cluster take no forwarded writes")
    if address is None:
        if not metadata_is_local(getattr(database.client, "metadata_url", "")):
            return ("the metadata store is on another machine and forward_address was not given (the address other "
                    "nodes dial, HOST[:PORT]), so the node does not guess one")
        address = "127.0.0.1"
    host, port = split_host_port(address)
    if is_wildcard(host):
        raise ConfigError(f"forward_address {address!r}: give the address other nodes dial, not a wildcard")
    return Server(database, host, port or 0)


class Server:
    """Server takes the forwarded transactions of followers on the node of `database` (see the module doc).

    Every node that may lead runs one; a node that does not lead refuses each new transaction
    (NotLeader, "refused": nothing ran, so the follower sends it to the new leader).
    """

    def __init__(self, database, host: str, port: int) -> None:
        self.database = database
        self.key = os.urandom(32)
        self._listener = socket.create_server((host, port))
        self.address = join_host_port(host, self._listener.getsockname()[1])
        self._stopped = threading.Event()
        self._channels: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        value = json.dumps({"address": self.address, "key": self.key.hex()}).encode()
        try:
            self._registration = database.client.store.register(endpoint_key(database.name, database.node_id), value)
        except BaseException:
            self._listener.close()
            raise
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"walkit-sqlite-forward-{database.name}",
                                          daemon=True)
        self._acceptor.start()

    def _accept_loop(self) -> None:
        self._listener.settimeout(POLL_S)              # close() stops the loop within POLL_S
        while not self._stopped.is_set():
            try:
                channel, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return                                 # closed
            channel.settimeout(None)
            channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(target=self._serve, args=(channel,), daemon=True,
                                      name=f"walkit-sqlite-forwarded-{self.database.name}")
            with self._lock:
                if self._stopped.is_set():
                    channel.close()
                    return
                self._channels.add(channel)
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, channel: socket.socket) -> None:
        session = None
        try:
            nonce = os.urandom(32)
            channel.settimeout(HANDSHAKE_S)
            send(channel, {"nonce": nonce})
            if not verify(self.key, nonce, receive(channel).get("proof", "")):
                send(channel, {"error": error_doc(errors.OperationalError("forwarding refused: wrong key"))})
                return
            send(channel, {"ok": True, "node": self.database.node_id})
            channel.settimeout(None)
            session = _Session(self.database)
            while not self._stopped.is_set():
                idle = session.conn is not None and session.conn.in_transaction
                channel.settimeout(IDLE_S if idle else None)        # a silent follower lets the write lock go
                request = receive(channel, give_up=(lambda: True) if idle else None)
                send(channel, session.handle(request))
        except (OSError, ConnectionError, ValueError) as exc:
            log.debug("%s: a forwarding channel ended: %s", self.database.node_id, exc)
        finally:
            if session is not None:
                session.close()
            with self._lock:
                self._channels.discard(channel)
            channel.close()

    def close(self) -> None:
        """close stops taking transactions; open ones are rolled back, a commit under way finishes first."""
        self._stopped.set()
        try:
            self._registration.close()
        except Exception:  # noqa: BLE001 - the session may be gone already
            pass
        self._acceptor.join(5)
        self._listener.close()
        with self._lock:
            channels, threads = list(self._channels), list(self._threads)
        for channel in channels:
            try:
                channel.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:
            thread.join(15)


class _Session:
    """_Session is one follower connection's side on the leader: a Connection of the leader running its statements."""

    def __init__(self, database) -> None:
        self.database = database
        self.conn = None

    def _connection(self, request: dict):
        if self.conn is None:
            self.conn = _ForwardedConnection(self.database, check_same_thread=False)
        conn = self.conn
        if not conn.in_transaction:               # the follower's settings, as of its transaction's start
            conn._timeout = float(request.get("timeout", 5.0))
            conn._db.set_busy_timeout(int(conn._timeout * 1000))
            conn._isolation_level = request.get("isolation_level", "")
            conn._group_commit = bool(request.get("group_commit", True))
        return conn

    def handle(self, request: dict) -> dict:
        """handle runs one request (`run`, `commit`, `rollback`) and returns the answer."""
        database = self.database
        op = request.get("op")
        conn = self._connection(request)
        reply: dict = {}
        try:
            if op == "run":
                if not conn.in_transaction and not database.is_leader:
                    reply["refused"] = True           # nothing ran: the follower may send it to the leader
                    raise database.not_leader()
                self._run(conn, request, reply)
            elif op == "commit":
                conn.commit()
            elif op == "rollback":
                conn.rollback()
            else:
                raise errors.ProgrammingError(f"unknown forwarded request {op!r}")
        except Exception as exc:  # noqa: BLE001 - every error goes back to the follower, typed
            reply["error"] = error_doc(exc)
        reply["in_transaction"] = conn.in_transaction
        if not conn.in_transaction:
            position = database.machine.position
            reply["position"] = list(position) if position is not None else None
        return reply

    def _run(self, conn, request: dict, reply: dict) -> None:
        cursor = conn.cursor()
        begin = request.get("begin")
        if begin:
            cursor.execute(begin)
            try:
                conn._write_locked()
                read_at = request.get("read_at", "unread")
                member = conn._txn.member if conn._txn is not None else None
                if read_at != "unread" and ((tuple(read_at) if read_at is not None else None) !=
                                            self.database.machine.position or (member is not None and member.before)):
                    error = errors.OperationalError("database is locked")
                    error.sqlite_errorcode, error.sqlite_errorname = 517, "SQLITE_BUSY_SNAPSHOT"
                    raise error
            except BaseException:
                conn.rollback()                       # a transaction that could not start holds no lock
                raise
        sql = request.get("sql")
        if sql is None:
            return
        mode = request.get("mode", "one")
        if mode == "script":
            with conn._lock:                          # executescript, but in the follower's transaction
                for statement in st.split(conn._preparing, sql):
                    conn._run(cursor, statement, (), implicit=False)
                    cursor._drain()
        elif mode == "many":
            cursor.executemany(sql, [read_parameters(request.get("params", []))])
        else:
            cursor.execute(sql, read_parameters(request.get("params", [])))
        if cursor.description is not None:
            reply["columns"] = [list(column) for column in cursor._columns]
            reply["rows"] = [list(row) for row in cursor.fetchall()]
        reply["rowcount"] = cursor.rowcount
        reply["lastrowid"] = cursor.lastrowid

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn._close()
            except Exception as exc:  # noqa: BLE001 - the database may be closing
                log.debug("closing a forwarded session: %s", exc)


class _ForwardedConnection(Connection):
    """_ForwardedConnection is a Connection of the leader for one follower's transactions: not a use of the database."""

    def _release(self) -> None:
        """_release does nothing: the follower's use does not keep the leader's node running (Server.close ends it)."""


# -- the follower's side --------------------------------------------------------------------------------
class Forwarder:
    """Forwarder is a follower connection's way to the leader: the channel and whether a transaction is open there."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self.database = connection._database
        self.active = False                           # a transaction of this connection is open on the leader
        self._channel: socket.socket | None = None
        self._leader: str | None = None

    # -- what the connection calls --------------------------------------------------------------------
    def begin(self, cursor, sql: str | None, parameters, mode: str = "one") -> None:
        """begin moves the connection's transaction to the leader and runs its first write statement `sql` there.

        The local transaction (reads only, so far) is rolled back; the leader starts one as it
        was started here (BEGIN or the savepoint), after checking that those reads were of
        the state it has.
        """
        conn = self.connection
        request = {"op": "run", "timeout": conn._timeout, "isolation_level": conn._isolation_level,
                   "group_commit": conn._group_commit}
        txn = conn._txn
        if txn is not None:
            savepoint = '"' + txn.savepoint.replace('"', '""') + '"' if txn.savepoint else None
            request["begin"] = ("BEGIN IMMEDIATE" if sql is None else f"SAVEPOINT {savepoint}" if savepoint
                                else "BEGIN")
            import apsw
            if conn._db.txn_state("main") != apsw.SQLITE_TXN_NONE:      # it read this node's copy
                request["read_at"] = _read_position(conn._db)
            conn._end_locally()
        elif sql is None:
            request["begin"] = "BEGIN IMMEDIATE"
        if sql is not None:
            request.update(sql=sql, params=wire_parameters(parameters), mode=mode)
        self._call(cursor, request, first=True)

    def run(self, cursor, sql: str, parameters, mode: str = "one") -> None:
        """run runs a statement of the open transaction on the leader."""
        self._call(cursor, {"op": "run", "sql": sql, "params": wire_parameters(parameters), "mode": mode})

    def commit(self) -> None:
        """commit commits the transaction on the leader and waits until this node applied it."""
        self._call(None, {"op": "commit"})

    def rollback(self) -> None:
        """rollback abandons the transaction on the leader (a broken channel: the leader rolled it back)."""
        if not self.active:
            return
        try:
            self._call(None, {"op": "rollback"})
        except errors.Error:
            pass
        finally:
            self.active = False

    def close(self) -> None:
        """close rolls back an open transaction and closes the channel."""
        self.rollback()
        self._drop()

    # -- the channel ----------------------------------------------------------------------------------
    def _call(self, cursor, request: dict, first: bool = False) -> None:
        """_call sends `request` and takes its answer: rows into `cursor`, the end of the transaction, errors."""
        deadline = time.monotonic() + max(self.connection._timeout, 0.0)
        while True:
            try:
                channel = self._connect(deadline) if first else self._channel
            except _Unreachable as unreachable:          # nothing was sent: a new leader may take it
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise unreachable.error from None
            if channel is None:
                raise OperationalError("the transaction forwarded to the leader was lost; it was rolled back")
            try:
                send(channel, request)
                reply = receive(channel, give_up=self._leader_gone)
            except (OSError, ConnectionError) as exc:
                self._drop()
                was_active, self.active = self.active, False
                if _may_commit(request, was_active):
                    raise CommitFailed(f"the channel to leader {self._leader!r} of {self.database.name!r} broke while "
                                       f"it may have been committing ({exc}); the transaction may or may not be in "
                                       f"the log: if it is, every node applies it", self.database.leader) from None
                raise OperationalError(f"the channel to leader {self._leader!r} of {self.database.name!r} broke "
                                       f"({exc}); the transaction was rolled back there") from None
            if first and reply.get("refused"):
                self._drop()                              # nothing ran there: the new leader takes it
                if time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
            break
        self.active = bool(reply.get("in_transaction"))
        if "error" not in reply and cursor is not None:
            cursor._take(reply.get("columns"), reply.get("rows", []), reply.get("rowcount", -1),
                         reply.get("lastrowid"))
        if not self.active and reply.get("position") is not None:
            self.database.wait_applied(tuple(reply["position"]))    # read-your-writes, here
        if "error" in reply:
            raise as_error(reply["error"])

    def _leader_gone(self) -> bool:
        """_leader_gone is True once another node leads than the one the answer is awaited from."""
        leader = self.database.node.leader
        return leader is not None and leader != self._leader

    def _connect(self, deadline: float) -> socket.socket:
        """_connect returns the channel to the leader, opening it (waiting until `deadline` for a leader) if needed."""
        database = self.database
        if secured(database.client):
            raise database.not_leader("forwarded writes are off on a secured cluster (CurveZMQ keys: the channel "
                                      "would bypass the log's ACLs); write through the leader's process")
        while True:
            leader = database.node.leader
            if self._channel is not None and leader == self._leader:
                return self._channel
            self._drop()
            if leader is not None:
                break
            if time.monotonic() >= deadline:
                raise database.not_leader()
            time.sleep(0.02)
        try:
            value, _ = database.client.store.get(endpoint_key(database.name, leader))
        except NoSuchKey:
            raise database.not_leader(f"node {leader!r} leads it but takes no forwarded writes (it was started with "
                                      f"forward_address=False, or without one on a metadata store on another "
                                      f"machine); write through its process") from None
        except WalkitError as exc:
            raise database.not_leader(f"the leader's forwarding address cannot be read: {exc}") from None
        endpoint = json.loads(value)
        host, port = split_host_port(endpoint["address"])
        try:
            channel = socket.create_connection((host, port), timeout=HANDSHAKE_S)
            channel.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = receive(channel)["nonce"]
            send(channel, {"proof": proof(bytes.fromhex(endpoint["key"]), nonce)})
            hello = receive(channel)
        except (OSError, ConnectionError, ValueError, KeyError) as exc:
            raise _Unreachable(database.not_leader(f"the channel to leader {leader!r} at {endpoint['address']} "
                                                   f"could not be opened ({exc}); nothing was sent")) from None
        if "error" in hello:
            channel.close()
            raise as_error(hello["error"])
        channel.settimeout(POLL_S)
        self._channel, self._leader = channel, leader
        return channel

    def _drop(self) -> None:
        if self._channel is not None:
            try:
                self._channel.close()
            except OSError:
                pass
        self._channel, self._leader = None, None


class _Unreachable(Exception):
    """_Unreachable is a leader whose channel could not be opened (it died, or was deposed): `error` if it stays so."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _may_commit(request: dict, active: bool) -> bool:
    """_may_commit is True if `request` may have committed a transaction on the leader (its answer was lost)."""
    if request["op"] == "commit":
        return True
    if request["op"] != "run" or request.get("sql") is None:
        return False
    if request.get("mode") == "script" or (not active and "begin" not in request):
        return True                                   # a script may commit; a statement outside one autocommits
    first = request["sql"].lstrip().split(None, 1)
    return bool(first) and first[0].upper().rstrip(";") in ("COMMIT", "END", "RELEASE")


def _read_position(db):
    """_read_position is the record position a connection's open read transaction sees (None before any)."""
    from walkit.adapters.sqlite.machine import has_position_table, read_position
    if not has_position_table(db):
        return None
    at, _ = read_position(db)
    return list(at) if at is not None else None
