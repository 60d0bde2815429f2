"""walkit.wire is the Cap'n Proto wire format (walkit.capnp) and its codec."""
