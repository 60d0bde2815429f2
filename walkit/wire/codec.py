"""walkit.wire.codec maps walkit.core.messages to and from Cap'n Proto (walkit.capnp).

This is the only module that imports capnp. A message is one `Envelope` holding a list of
requests or a list of responses. Decoding is defensive: bytes from the network may be anything,
so every failure becomes `WireError` (the whole frame is unusable) or a BAD_REQUEST
`ErrorResponse` for one request, and the caller keeps serving.
"""

from __future__ import annotations

import ctypes
import os
from itertools import repeat
from types import SimpleNamespace

import capnp

from walkit.core.messages import (
    MAX_FRAME_BYTES, AddRequest, AddResponse, Entry, ErrorResponse, ForceRequest, ForceResponse, ReadLacRequest,
    ReadLacResponse, ReadRequest, ReadResponse, Status, WriteLacRequest, WriteLacResponse,
)
from walkit.errors import ProtocolError

capnp.remove_import_hook()
schema = capnp.load(os.path.join(os.path.dirname(__file__), "walkit.capnp"))

#: Frames larger than this are refused before decoding (BAD_REQUEST).
DEFAULT_MAX_FRAME = MAX_FRAME_BYTES
#: Frames holding more requests than this are refused whole (TOO_MANY_REQUESTS); clients split
#: what they send to stay below it.
DEFAULT_MAX_REQUESTS = 4096
_NESTING = 16
#: Cap'n Proto's traversal limit counts every word read, and a list of zero-size elements costs
#: one word per element however short the frame. The limit follows the frame's own size, so a
#: few bytes cannot make the decoder walk millions of elements (each word of a frame is read
#: about once by the decoder; the factor and the floor leave room for list headers).
_TRAVERSAL_FACTOR = 4
_TRAVERSAL_FLOOR = 64

_STATUS_NAMES = {s: "".join([w.lower() if i == 0 else w.capitalize()
                             for i, w in enumerate(s.name.split("_"))]) for s in Status if s < 100}
_STATUSES = {int(s): s for s in Status}


def _fields(struct) -> SimpleNamespace:
    """_fields names a struct's fields as pycapnp field objects.

    Reading and writing through them (`_get_by_field`, `_set_by_field`, `_init_by_field`)
    skips pycapnp's lookup of the field by its name: about 0.2 instead of 0.8 us a field on
    this project's 2-core VM, and a small message has a dozen or two. The union's member is
    read with `_which_str()` for the same reason (0.35 instead of 1.25 us).
    """
    return SimpleNamespace(**struct.schema.fields)


_ENVELOPE, _REQUEST, _RESPONSE = _fields(schema.Envelope), _fields(schema.Request), _fields(schema.Response)
_BATCH = _fields(schema.EntryBatch)
_ADD, _READ, _READ_LAC = _fields(schema.AddRequest), _fields(schema.ReadRequest), _fields(schema.ReadLacRequest)
_WRITE_LAC, _FORCE = _fields(schema.WriteLacRequest), _fields(schema.ForceRequest)
_ADDED, _READ_OUT, _LAC_OUT = _fields(schema.AddResponse), _fields(schema.ReadResponse), _fields(schema.ReadLacResponse)
_WRITE_LAC_OUT, _FORCED = _fields(schema.WriteLacResponse), _fields(schema.ForceResponse)


class WireError(ProtocolError):
    """WireError is raised when a frame is not a walkit Envelope at all."""


class FrameTooBusy(WireError):
    """FrameTooBusy is raised when a frame holds more requests than the receiver takes at once."""


def _aligned(data):
    """_aligned returns `data` if Cap'n Proto can read it in place (bytes, or a buffer on a word boundary), else a copy.

    Reading a received ZeroMQ frame in place (its `buffer`) saves copying it first, and
    pycapnp reads an aligned buffer much faster than bytes (about 2.4x for a 300 KB frame).
    """
    if type(data) is bytes:
        return data
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    except (TypeError, ValueError):         # read-only or empty: copy
        return bytes(data)
    return data if address % 8 == 0 else bytes(data)


def _load(data, max_frame: int):
    data = _aligned(data)
    if len(data) > max_frame:
        raise WireError(f"frame of {len(data)} bytes exceeds the limit of {max_frame} bytes")
    if len(data) < 8 or len(data) % 8:
        raise WireError(f"frame of {len(data)} bytes is not a Cap'n Proto message")
    words = len(data) // 8
    return schema.Envelope.from_bytes(data, traversal_limit_in_words=words * _TRAVERSAL_FACTOR + _TRAVERSAL_FLOOR,
                                      nesting_limit=_NESTING)


def _set_entries(batch, ledger_id: int, entries: list[Entry]) -> None:
    """_set_entries writes entries of one ledger as the columns of an EntryBatch (`batch`, initialised)."""
    if not entries:
        return
    # Columns, transposed in C. Lists are set by name: pycapnp takes a tuple there, and its
    # by-field path is slower for lists (it is faster only for single values).
    ledger_ids, batch.entryIds, batch.lacs, batch.digests, batch.payloads = zip(*entries)
    if ledger_ids.count(ledger_id) != len(ledger_ids):
        raise ValueError(f"an entry batch of ledger {ledger_id} holds entries of another ledger")


def _get_entries(batch, ledger_id: int) -> list[Entry]:
    """_get_entries reads an EntryBatch (`batch`) back into Entry tuples of `ledger_id`."""
    get = batch._get_by_field
    ids, lacs = list(get(_BATCH.entryIds)), list(get(_BATCH.lacs))
    digests, payloads = list(get(_BATCH.digests)), list(get(_BATCH.payloads))
    if not len(ids) == len(lacs) == len(digests) == len(payloads):
        raise WireError(f"entry batch columns differ in length: {len(ids)}, {len(lacs)}, {len(digests)}, "
                        f"{len(payloads)}")
    # tuple.__new__ over zipped columns builds the Entry tuples in C (Entry(...) is a Python-level __new__).
    count = len(ids)
    return list(map(tuple.__new__, repeat(Entry, count), zip(repeat(ledger_id, count), ids, lacs, digests, payloads)))


# -- requests ------------------------------------------------------------------------------------
def encode_requests(requests: list) -> bytes:
    """encode_requests returns one frame carrying `requests`."""
    message = schema.Envelope.new_message()
    out = message._init_by_field(_ENVELOPE.requests, len(requests))
    for i, request in enumerate(requests):
        r = out[i]
        r._set_by_field(_REQUEST.txnId, request.txn)
        kind = type(request)
        if kind is AddRequest:
            a = r._init_by_field(_REQUEST.add)
            put = a._set_by_field
            put(_ADD.ledgerId, request.ledger_id)
            put(_ADD.masterKey, request.master_key)
            if request.recovery:
                put(_ADD.recovery, True)
            if request.lafr != -1:
                put(_ADD.lafr, request.lafr)
            if request.term:
                put(_ADD.term, request.term)
                put(_ADD.truncate, request.truncate)
            if request.deferred_sync:
                put(_ADD.deferredSync, True)
            if request.truncate_from != -1:
                put(_ADD.truncateFrom, request.truncate_from)
            _set_entries(a._init_by_field(_ADD.entries), request.ledger_id, request.entries)
        elif kind is ReadRequest:
            rd = r._init_by_field(_REQUEST.read)
            put = rd._set_by_field
            put(_READ.ledgerId, request.ledger_id)
            rd.entryIds = request.entry_ids                  # a list: by name (see _set_entries)
            put(_READ.fence, request.fence)
            put(_READ.masterKey, request.master_key)
            put(_READ.previousLac, request.previous_lac)
            put(_READ.timeoutMs, request.timeout_ms)
            if request.term:
                put(_READ.term, request.term)
            if request.max_bytes:
                put(_READ.maxBytes, request.max_bytes)
        elif kind is ReadLacRequest:
            put = r._init_by_field(_REQUEST.readLac)._set_by_field
            put(_READ_LAC.ledgerId, request.ledger_id)
            put(_READ_LAC.fence, request.fence)
            put(_READ_LAC.masterKey, request.master_key)
            put(_READ_LAC.previousLac, request.previous_lac)
            put(_READ_LAC.timeoutMs, request.timeout_ms)
            if request.term:
                put(_READ_LAC.term, request.term)
        elif kind is WriteLacRequest:
            put = r._init_by_field(_REQUEST.writeLac)._set_by_field
            put(_WRITE_LAC.ledgerId, request.ledger_id)
            put(_WRITE_LAC.masterKey, request.master_key)
            put(_WRITE_LAC.lac, request.lac)
        elif kind is ForceRequest:
            put = r._init_by_field(_REQUEST.force)._set_by_field
            put(_FORCE.ledgerId, request.ledger_id)
            put(_FORCE.masterKey, request.master_key)
        else:
            raise TypeError(f"not a request: {request!r}")
    return message.to_bytes()


def _decode_request(r):
    get = r._get_by_field
    txn = get(_REQUEST.txnId)
    which = r._which_str()
    if which == "add":
        g = get(_REQUEST.add)._get_by_field
        ledger_id = g(_ADD.ledgerId)
        return AddRequest(txn=txn, ledger_id=ledger_id, master_key=g(_ADD.masterKey), recovery=g(_ADD.recovery),
                          entries=_get_entries(g(_ADD.entries), ledger_id), lafr=g(_ADD.lafr), term=g(_ADD.term),
                          truncate=g(_ADD.truncate), deferred_sync=g(_ADD.deferredSync),
                          truncate_from=g(_ADD.truncateFrom))
    if which == "read":
        g = get(_REQUEST.read)._get_by_field
        return ReadRequest(txn=txn, ledger_id=g(_READ.ledgerId), entry_ids=list(g(_READ.entryIds)),
                           fence=g(_READ.fence), master_key=g(_READ.masterKey), previous_lac=g(_READ.previousLac),
                           timeout_ms=g(_READ.timeoutMs), term=g(_READ.term), max_bytes=g(_READ.maxBytes))
    if which == "readLac":
        g = get(_REQUEST.readLac)._get_by_field
        return ReadLacRequest(txn=txn, ledger_id=g(_READ_LAC.ledgerId), fence=g(_READ_LAC.fence),
                              master_key=g(_READ_LAC.masterKey), previous_lac=g(_READ_LAC.previousLac),
                              timeout_ms=g(_READ_LAC.timeoutMs), term=g(_READ_LAC.term))
    if which == "writeLac":
        g = get(_REQUEST.writeLac)._get_by_field
        return WriteLacRequest(txn=txn, ledger_id=g(_WRITE_LAC.ledgerId), master_key=g(_WRITE_LAC.masterKey),
                               lac=g(_WRITE_LAC.lac))
    if which == "force":
        g = get(_REQUEST.force)._get_by_field
        return ForceRequest(txn=txn, ledger_id=g(_FORCE.ledgerId), master_key=g(_FORCE.masterKey))
    raise WireError(f"unknown request kind {which!r}")


def decode_requests(data, max_frame: int = DEFAULT_MAX_FRAME, max_requests: int = DEFAULT_MAX_REQUESTS) -> list:
    """decode_requests returns the requests of a frame (bytes or a buffer); undecodable ones become ErrorResponses.

    It raises WireError when the frame is not an Envelope of requests at all, and FrameTooBusy
    when it holds more than `max_requests` requests.
    """
    try:
        with _load(data, max_frame) as envelope:
            if envelope._which_str() != "requests":
                raise WireError("expected requests, got responses")
            requests = envelope._get_by_field(_ENVELOPE.requests)
            if len(requests) > max_requests:
                raise FrameTooBusy(f"frame holds {len(requests)} requests, more than the limit of {max_requests}")
            decoded: list = []
            for r in requests:
                try:
                    decoded.append(_decode_request(r))
                except (capnp.KjException, WireError, ValueError) as exc:
                    txn = _safe_txn(r)
                    decoded.append(ErrorResponse(txn=txn, status=Status.BAD_REQUEST,
                                                 message=f"malformed request: {_short(exc)}"))
            return decoded
    except WireError:
        raise
    except (capnp.KjException, ValueError, TypeError) as exc:
        raise WireError(f"malformed frame: {_short(exc)}") from None


def _safe_txn(r) -> int:
    try:
        return r._get_by_field(_REQUEST.txnId)
    except Exception:  # noqa: BLE001 - anything that fails here already failed decoding
        return 0


def _short(exc: Exception) -> str:
    text = str(exc).split("\nstack:")[0]
    return text.rsplit("failed: ", 1)[-1][:200]


# -- responses -----------------------------------------------------------------------------------
def encode_responses(responses: list, disk: int = 0) -> bytes:
    """encode_responses returns one frame carrying `responses`, all from the bookie storage `disk`.

    The disk is written once per frame (not once per response); decoding sets it on each.
    """
    message = schema.Envelope.new_message()
    if disk:
        message._set_by_field(_ENVELOPE.disk, disk)
    out = message._init_by_field(_ENVELOPE.responses, len(responses))
    for i, response in enumerate(responses):
        r = out[i]
        put = r._set_by_field
        put(_RESPONSE.txnId, response.txn)
        put(_RESPONSE.status, _STATUS_NAMES[response.status])
        if response.message:
            put(_RESPONSE.message, response.message)
        kind = type(response)
        if kind is AddResponse:
            a = r._init_by_field(_RESPONSE.add)
            put = a._set_by_field
            put(_ADDED.ledgerId, response.ledger_id)
            a.entryIds = response.entry_ids                  # a list: by name (see _set_entries)
            if response.instance:
                put(_ADDED.instance, response.instance)
        elif kind is ReadResponse:
            rd = r._init_by_field(_RESPONSE.read)
            rd._set_by_field(_READ_OUT.ledgerId, response.ledger_id)
            rd._set_by_field(_READ_OUT.lac, response.lac)
            if response.unread:
                rd._set_by_field(_READ_OUT.unread, response.unread)
            _set_entries(rd._init_by_field(_READ_OUT.entries), response.ledger_id, response.entries)
        elif kind is ReadLacResponse:
            put = r._init_by_field(_RESPONSE.readLac)._set_by_field
            put(_LAC_OUT.ledgerId, response.ledger_id)
            put(_LAC_OUT.lac, response.lac)
            put(_LAC_OUT.lastEntryId, response.last_entry_id)
            if response.lafr != -1:
                put(_LAC_OUT.lafr, response.lafr)
        elif kind is WriteLacResponse:
            r._init_by_field(_RESPONSE.writeLac)._set_by_field(_WRITE_LAC_OUT.ledgerId, response.ledger_id)
        elif kind is ForceResponse:
            put = r._init_by_field(_RESPONSE.force)._set_by_field
            put(_FORCED.ledgerId, response.ledger_id)
            put(_FORCED.instance, response.instance)
        elif kind is ErrorResponse:
            put(_RESPONSE.error, None)
        else:
            raise TypeError(f"not a response: {response!r}")
    return message.to_bytes()


def decode_responses(data, max_frame: int = DEFAULT_MAX_FRAME) -> list:
    """decode_responses returns the responses of a frame (bytes or a buffer); it raises WireError on garbage."""
    try:
        with _load(data, max_frame) as envelope:
            if envelope._which_str() != "responses":
                raise WireError("expected responses, got requests")
            disk = envelope._get_by_field(_ENVELOPE.disk)
            return [_decode_response(r, disk) for r in envelope._get_by_field(_ENVELOPE.responses)]
    except WireError:
        raise
    except (capnp.KjException, ValueError, TypeError, KeyError) as exc:
        raise WireError(f"malformed frame: {_short(exc)}") from None


def _decode_response(r, disk: int):
    get = r._get_by_field
    txn = get(_RESPONSE.txnId)
    status = _STATUSES[get(_RESPONSE.status).raw]
    message = get(_RESPONSE.message)
    which = r._which_str()
    if which == "add":
        g = get(_RESPONSE.add)._get_by_field
        return AddResponse(txn=txn, status=status, ledger_id=g(_ADDED.ledgerId), entry_ids=list(g(_ADDED.entryIds)),
                           message=message, instance=g(_ADDED.instance), disk=disk)
    if which == "read":
        g = get(_RESPONSE.read)._get_by_field
        ledger_id = g(_READ_OUT.ledgerId)
        return ReadResponse(txn=txn, status=status, ledger_id=ledger_id,
                            entries=_get_entries(g(_READ_OUT.entries), ledger_id), lac=g(_READ_OUT.lac),
                            message=message, disk=disk, unread=g(_READ_OUT.unread))
    if which == "readLac":
        g = get(_RESPONSE.readLac)._get_by_field
        return ReadLacResponse(txn=txn, status=status, ledger_id=g(_LAC_OUT.ledgerId), lac=g(_LAC_OUT.lac),
                               last_entry_id=g(_LAC_OUT.lastEntryId), message=message, lafr=g(_LAC_OUT.lafr),
                               disk=disk)
    if which == "writeLac":
        return WriteLacResponse(txn=txn, status=status,
                                ledger_id=get(_RESPONSE.writeLac)._get_by_field(_WRITE_LAC_OUT.ledgerId),
                                message=message, disk=disk)
    if which == "force":
        g = get(_RESPONSE.force)._get_by_field
        return ForceResponse(txn=txn, status=status, ledger_id=g(_FORCED.ledgerId), message=message,
                             instance=g(_FORCED.instance), disk=disk)
    return ErrorResponse(txn=txn, status=status, message=message, disk=disk)
