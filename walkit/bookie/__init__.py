"""walkit.bookie is the bookie server: request service with group commit, and its process."""
