"""walkit.adapters.sqlite.channel is the wire between a follower and the leader for forwarded writes.

One TCP connection per follower connection carries frames (a 4-byte length, then JSON; bytes
as {"$b": base64}). The leader speaks first: a nonce, which the follower answers with an
HMAC-SHA256 of it under the key the leader published (`endpoint_key`), before anything runs.
Then each request gets one answer. Errors travel as their DB-API class, message and SQLite
result code (`error_doc`, `as_error`), parameters as plain values (`wire_parameters`).
walkit.adapters.sqlite.forwarding says what travels and why.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import struct

from walkit.adapters.sqlite import errors
from walkit.adapters.sqlite.errors import CommitFailed, NotLeader, OperationalError

_FRAME = struct.Struct(">I")
#: The largest frame either side accepts (a transaction's record is at most 60 MiB; rows may be more).
MAX_FRAME = 1 << 30
_PROOF = b"walkit-sqlite-forward"


def endpoint_key(name: str, node_id: str) -> str:
    """endpoint_key is where node `node_id` of database `name` publishes its forwarding address and key."""
    return f"sqlite/{name}/forward/{node_id.replace('/', '_')}"


def secured(client) -> bool:
    """secured is True on a cluster whose clients hold CurveZMQ keys (walkit.security): no forwarding there."""
    return bool(getattr(client, "principal", ""))


# -- frames -------------------------------------------------------------------------------------------
def _default(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode()}
    raise TypeError(f"cannot forward a value of type {type(value).__name__}")


def _hook(doc: dict):
    return base64.b64decode(doc["$b"]) if len(doc) == 1 and "$b" in doc else doc


def encode(doc: dict) -> bytes:
    """encode is a frame's JSON; bytes travel as {"$b": base64} (named parameters travel as pairs, so no key is "$b")."""
    return json.dumps(doc, default=_default, separators=(",", ":")).encode()


def decode(data: bytes) -> dict:
    """decode reads what `encode` wrote."""
    return json.loads(data, object_hook=_hook)


def send(sock: socket.socket, doc: dict) -> None:
    """send writes one frame."""
    payload = encode(doc)
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def receive(sock: socket.socket, give_up=None) -> dict:
    """receive reads one frame; with `give_up`, the socket has a timeout and `give_up()` is asked at each one."""
    size = _FRAME.unpack(_exactly(sock, _FRAME.size, give_up))[0]
    if size > MAX_FRAME:
        raise ConnectionError(f"a frame of {size} bytes is over the limit of {MAX_FRAME}")
    return decode(_exactly(sock, size, give_up))


def _exactly(sock: socket.socket, size: int, give_up) -> bytes:
    chunks, got = [], 0
    while got < size:
        try:
            chunk = sock.recv(min(size - got, 1 << 20))
        except socket.timeout:
            if give_up is not None and give_up():
                raise ConnectionError("gave up waiting for the leader's answer") from None
            continue
        if not chunk:
            raise ConnectionError("the channel was closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def verify(key: bytes, nonce: bytes, answer) -> bool:
    """verify is True if `answer` is the `proof` of `nonce` under `key` (compared in constant time)."""
    return hmac.compare_digest(str(answer), proof(key, nonce))


def proof(key: bytes, nonce: bytes) -> str:
    """proof is what a follower sends to show it holds the leader's key: an HMAC of the nonce."""
    return hmac.new(key, _PROOF + nonce, hashlib.sha256).hexdigest()


# -- errors across the channel ------------------------------------------------------------------------
_CLASSES = {cls.__name__: cls for cls in (
    errors.Warning, errors.Error, errors.InterfaceError, errors.DatabaseError, errors.DataError,
    errors.OperationalError, errors.IntegrityError, errors.InternalError, errors.ProgrammingError,
    errors.NotSupportedError, TypeError, ValueError, OverflowError, KeyError, IndexError)}


def error_doc(exc: BaseException) -> dict:
    """error_doc describes an exception of the leader's session for the follower (`raise_error`)."""
    doc = {"class": type(exc).__name__, "message": str(exc), "leader": getattr(exc, "leader", None)}
    for attribute in ("sqlite_errorcode", "sqlite_errorname"):
        if hasattr(exc, attribute):
            doc[attribute] = getattr(exc, attribute)
    if isinstance(exc, errors.TransactionTooLarge):
        doc.update(size=exc.size, limit=exc.limit, setting=exc.setting)
    return doc


def as_error(doc: dict) -> BaseException:
    """as_error is the exception an `error_doc` describes, of the same DB-API class."""
    name, message = doc["class"], doc["message"]
    if name == "NotLeader":
        error = NotLeader(message, doc.get("leader"))
    elif name == "CommitFailed":
        error = CommitFailed(message, doc.get("leader"))
    elif name == "TransactionTooLarge":
        error = errors.TransactionTooLarge(message, doc.get("size", 0), doc.get("limit", 0), doc.get("setting", ""))
    elif name in ("ReplicaStopped", "MissingFunction"):
        error = OperationalError(f"the leader's node cannot write: {message}")
    else:
        error = _CLASSES.get(name, errors.OperationalError)(message)
    for attribute in ("sqlite_errorcode", "sqlite_errorname"):
        if attribute in doc:
            setattr(error, attribute, doc[attribute])
    return error


def wire_parameters(parameters):
    """wire_parameters is a statement's parameters as they travel: a list of values, or {"named": [[name, value]]}."""
    from walkit.adapters.sqlite import dbapi
    if isinstance(parameters, dict):
        return {"named": [[name, dbapi._bindable(value, i)] for i, (name, value) in enumerate(parameters.items(), 1)]}
    if parameters is None:
        return []
    if not hasattr(type(parameters), "__getitem__"):
        raise errors.ProgrammingError("parameters are of unsupported type")
    return [dbapi._bindable(parameters[i], i + 1) for i in range(len(parameters))]


def read_parameters(wired):
    """read_parameters is what `wire_parameters` sent, as the leader's execute takes it."""
    return dict(wired["named"]) if isinstance(wired, dict) else tuple(wired)
