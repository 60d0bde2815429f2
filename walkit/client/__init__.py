"""walkit.client is the imperative shell of the client: the I/O thread and the public API."""
