"""walkit.transport carries frames between clients and bookies: ZeroMQ, or in-process for tests."""
