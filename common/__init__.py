"""Process plumbing every part of the service shares: per-process state and Redis connections."""
