"""walkit.adapters.topics.handlers answers each Kafka request type, one module per family.

`handle(broker, connection, request)` runs the handler of the request's api key and returns
the encoded response frame, or None when the protocol wants no answer (Produce, acks=0).
Handlers raise nothing on bad input they can name: they answer with the protocol's error
codes (errors.py).
"""

from __future__ import annotations

from walkit.adapters.topics.handlers import acls, admin, cluster, commits, configs, fetch, groups, produce, records, sasl, transactions

HANDLERS = {}
for _module in (acls, admin, cluster, commits, configs, fetch, groups, produce, records, sasl, transactions):
    HANDLERS.update(_module.HANDLERS)


async def handle(broker, connection, request):
    """handle answers one request (see the module doc)."""
    return await HANDLERS[request.api_key](broker, connection, request)
