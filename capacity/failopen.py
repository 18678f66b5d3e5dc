"""The limiter's one fail-open policy: its own failures never refuse or stop a call.

Any error while counting, renewing or releasing is turned into a value by the lane store's verbs
(capacity.store.verb: `Unknown`, with the error as `<ExcClass>: <message>` up to 300 characters) and logged
once here. A Redis error that shows Redis can't serve (a refused or broken connection, an error reply, no
answer to an operation sent) also opens the skip window (capacity.store.LaneStore.mark_unavailable): until a
probe sees Redis answer (capacity.breaker), for at most CAPACITY_REDIS_RETRY_SECONDS, this process doesn't
call Redis for capacity, so an outage costs at most a probe's time of calls per process per window, by at
most the deadline each. An error that may be this process's own slowness (the deadline passed before the
operation was sent, the Redis thread's queue full: capacity.runner.Unsent, capacity.threads.Busy) opens the
window only once the probe, asked at once, finds no answer either: fail-open is for Redis being down, not for
a busy or starved host. Other errors (a bug) leave the window shut.
"""
import logging

import redis

logger = logging.getLogger('heavy_lanes')
ERROR_LENGTH = 300
SKIPPED = 'skipped: Redis failed recently'
RELEASE_DEFERRED = 'release deferred: Redis failed recently; it is sent when Redis answers again'


def describe(ex):
    return f'{type(ex).__name__}: {ex}'[:ERROR_LENGTH]


def record(ex, action, store=None):
    """Log `ex`, met while doing `action`, and go on without the limiter; a Redis error opens `store`'s skip
    window, or has the probe decide (see the module docstring). Returns the description."""
    error = describe(ex)
    if store is not None and isinstance(ex, redis.RedisError):
        store.suspect(ex)
    logger.warning('Capacity %s failed open (%s)', action, error)
    return error
