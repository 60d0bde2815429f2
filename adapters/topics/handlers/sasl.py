"""walkit.adapters.topics.handlers.sasl answers SaslHandshake and SaslAuthenticate outside authentication.

Authentication itself happens before requests reach the handlers (sasl.SaslGate, fed by the
server). A SaslHandshake or SaslAuthenticate that arrives here comes on a connection that has
authenticated already, or to a broker that does not require SASL: both get
ILLEGAL_SASL_STATE, as Kafka's broker answers them (KafkaApis), so a client configured for
SASL against a broker without it fails at once with a clear error.
"""

from __future__ import annotations

from kafka.protocol.sasl import (
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.sasl import MECHANISMS


def _mechanisms(connection) -> list[str]:
    return MECHANISMS if connection.server.users is not None else []


async def sasl_handshake(broker, connection, request):
    """sasl_handshake refuses a handshake outside authentication (ILLEGAL_SASL_STATE)."""
    return request.response(SaslHandshakeResponse, error_code=errors.ILLEGAL_SASL_STATE,
                            mechanisms=_mechanisms(connection))


async def sasl_authenticate(broker, connection, request):
    """sasl_authenticate refuses authentication outside the SASL exchange (ILLEGAL_SASL_STATE)."""
    if connection.server.users is None:
        message = "this broker does not use SASL (walkit topics serve without --sasl-users/--sasl-user)"
    else:
        message = "SaslAuthenticate request received after successful authentication"
    return request.response(SaslAuthenticateResponse, error_code=errors.ILLEGAL_SASL_STATE, error_message=message,
                            auth_bytes=b"", session_lifetime_ms=0)


HANDLERS = {
    SaslHandshakeRequest.API_KEY: sasl_handshake,
    SaslAuthenticateRequest.API_KEY: sasl_authenticate,
}
