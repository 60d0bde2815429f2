"""walkit.adapters holds applications built on the public walkit API (installed from adapters/)."""
