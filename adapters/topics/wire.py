"""walkit.adapters.topics.wire turns Kafka frames into request objects and responses into frames.

A Kafka frame is a big-endian int32 size and that many bytes: a request header (api key,
api version, correlation id, client id, and tagged fields in flexible versions) then the body.
Bodies are encoded and decoded by kafka-python's schema-generated messages
(`kafka.protocol`), one class per API with every version. `parse_request` never raises
anything but `BadRequest`; the server closes a connection that sent one, as Kafka does.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from kafka.protocol.metadata import ApiVersionsResponse

from walkit.adapters.topics import errors
from walkit.adapters.topics.versions import SUPPORTED, advertised

_HEAD = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")


class BadRequest(Exception):
    """BadRequest is a frame that cannot be served: unknown api, unsupported version or bad bytes."""


@dataclass
class Request:
    """Request is one decoded request: its header fields and the kafka-python body object."""

    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: object

    def response(self, cls, **fields) -> bytes:
        """response encodes a `cls` response (a kafka-python class) to this request as a frame."""
        message = cls(version=self.version, **fields)
        message.with_header(correlation_id=self.correlation_id)
        return bytes(message.encode(header=True, framed=True))


def frame_size(buffer, offset: int = 0) -> int:
    """frame_size reads the size prefix at `offset` of `buffer`."""
    return _SIZE.unpack_from(buffer, offset)[0]


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """peek_header returns (api key, api version, correlation id) of a frame body; BadRequest if too short."""
    if len(frame) < _HEAD.size:
        raise BadRequest(f"a request of {len(frame)} bytes has no header")
    return _HEAD.unpack_from(frame)


def parse_request(frame: bytes) -> Request:
    """parse_request decodes a frame body (without its size prefix) into a Request."""
    api_key, version, correlation_id = peek_header(frame)
    entry = SUPPORTED.get(api_key)
    if entry is None:
        raise BadRequest(f"unknown api key {api_key}")
    cls, low, high = entry
    if not low <= version <= high:
        raise BadRequest(f"{cls.__name__} version {version} is not supported ({low}-{high})")
    try:
        body = cls.decode(frame, version=version, header=True)
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the peer's malformed frame
        raise BadRequest(f"malformed {cls.__name__} v{version}: {type(exc).__name__}: {exc}") from None
    header = body.header
    return Request(api_key, version, correlation_id, header.client_id, body)


def api_versions_error(frame: bytes) -> bytes | None:
    """api_versions_error is Kafka's answer to an ApiVersions request of an unknown version.

    It is an ApiVersions v0 response with UNSUPPORTED_VERSION and the supported table, so the
    client retries with a version both sides know. Any other frame gets None.
    """
    try:
        api_key, version, correlation_id = peek_header(frame)
    except BadRequest:
        return None
    if api_key != ApiVersionsResponse.API_KEY or SUPPORTED[api_key][1] <= version <= SUPPORTED[api_key][2]:
        return None
    message = ApiVersionsResponse(version=0, error_code=errors.UNSUPPORTED_VERSION, api_keys=api_table())
    message.with_header(correlation_id=correlation_id)
    return bytes(message.encode(header=True, framed=True))


@functools.cache
def api_table() -> list:
    """api_table is the ApiVersions response's list of supported APIs (built once: callers must not change it).

    The ranges are versions.advertised: Produce reaches down to v0 there, served from v3.
    """
    entry = ApiVersionsResponse.ApiVersion
    return [entry(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in ((key, advertised(key)) for key in sorted(SUPPORTED))]

