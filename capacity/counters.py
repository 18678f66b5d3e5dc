"""Cluster-wide event counters kept in Redis, so /metrics is right however many API and worker
processes there are: decisions by queue, tier and decision; each full lane of a refused or
shadow-refused call; renewals that failed. One hash under the lane prefix; increments go through the lane
store's deadline and never fail a call.
"""
import logging

from capacity.keys import lane_key
from capacity.store import RedisLanes

logger = logging.getLogger('heavy_lanes')
SEPARATOR = '|'


def counters_key():
    return lane_key('stats', 'counters')


def increment(*fields):
    """Add 1 to each field (a tuple of labels), without waiting: the Redis thread does it after the
    caller's own operations. A counter never costs a call anything; one that can't be counted is dropped."""
    if not fields or not RedisLanes.is_available():
        return
    key = counters_key()
    names = [SEPARATOR.join(str(label) for label in labels) for labels in fields]

    def op(client):
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hincrby(key, name, 1)
        return pipe.execute()
    try:
        RedisLanes.get_redis_thread().submit(op, RedisLanes.get_client())
    except Exception as ex:  # noqa: BLE001 - the thread is busy: drop the count, never delay the call
        logger.debug('Capacity counter not counted (%s)', ex)


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
