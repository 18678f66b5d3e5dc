"""Cluster-wide event counters kept in Redis, so /metrics is right however many API and worker
processes there are: decisions by queue, tier and decision; each full lane of a refused or
shadow-refused call; renewals that failed. One hash under the lane prefix; increments gather in the
process and reach Redis on the lane store's Redis thread, and never delay or fail a call.
"""
import logging
import os
import threading
from collections import Counter

from capacity.keys import lane_key
from capacity.store import RedisLanes

logger = logging.getLogger('heavy_lanes')
SEPARATOR = '|'


def counters_key():
    return lane_key('stats', 'counters')


_pending = Counter()  # field -> increments not yet sent
_pending_lock = threading.Lock()
_flush_queued = False


def increment(*fields):
    """Add 1 to each field (a tuple of labels), without making the caller wait for Redis.

    Increments gather in this process and one flush job at a time takes them to Redis on the Redis
    thread, so counters never hold more than one of its few queue places (the calls' own operations need
    them). A counter never costs a call anything: when they can't be sent they are dropped.
    """
    global _flush_queued
    if not fields or not RedisLanes.is_available():
        return
    with _pending_lock:
        for labels in fields:
            _pending[SEPARATOR.join(str(label) for label in labels)] += 1
        if _flush_queued:
            return
        _flush_queued = True
    try:
        RedisLanes.get_redis_thread().submit(_flush, RedisLanes.get_client(), counters_key())
    except Exception as ex:  # noqa: BLE001 - the thread is busy: keep the counts for the next flush
        with _pending_lock:
            _flush_queued = False
        logger.debug('Capacity counters not sent yet (%s)', ex)


def _flush(client, key):
    """Send the gathered increments (on the Redis thread); on an error they are dropped."""
    global _flush_queued
    with _pending_lock:
        counts = dict(_pending)
        _pending.clear()
        _flush_queued = False
    if counts:
        pipe = client.pipeline(transaction=False)
        for name, count in counts.items():
            pipe.hincrby(key, name, count)
        pipe.execute()


def _after_fork():
    global _pending_lock, _flush_queued
    _pending_lock = threading.Lock()
    _pending.clear()
    _flush_queued = False


os.register_at_fork(after_in_child=_after_fork)


def record_decision(gate, queue):
    """Count one gated call: its decision, and each lane it found full."""
    if gate is None or gate.decision is None:
        return
    fields = [('decision', queue, gate.tier or 'unknown', gate.decision)]
    fields += [('full', lane, gate.tier or 'unknown', gate.decision) for lane in gate.full]
    increment(*fields)


def read():
    """{(kind, *labels): count} for every counter."""
    raw = RedisLanes.call(lambda client: client.hgetall(counters_key()), RedisLanes.get_client())
    counts = {}
    for field, value in raw.items():
        field = field.decode() if isinstance(field, bytes) else field
        counts[tuple(field.split(SEPARATOR))] = int(value)
    return counts
