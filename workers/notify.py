"""Tell a waiting API request that a call finished, through Redis pub/sub on the lanes' Redis.

A waiter subscribes first, then reads the call's row, then waits for the message, so a call that finishes
between the two is never missed. A lost message only costs the waiter its timeout: the row is the truth.
"""
import os
import threading
import time

import redis

from capacity.keys import notice_channel as channel
from common import connections


def get_client():
    return connections.connect('notices')


def publish(call_id, state):
    """Announce that a call reached `state`; never raises (the waiter falls back to its timeout)."""
    try:
        get_client().publish(channel(call_id), str(state))
    except redis.RedisError:
        pass


_local = threading.local()  # this thread's subscriber connection, kept between waits


def subscriber():
    """This thread's PubSub: a new connection costs more than the wait's own commands (bench/roundtrip)."""
    pubsub = getattr(_local, 'pubsub', None)
    if pubsub is None or _local.pid != os.getpid():
        # One made before a fork belongs to the parent: dropped, never closed (that would write to its socket).
        pubsub = _local.pubsub = get_client().pubsub(ignore_subscribe_messages=True)
        _local.pid = os.getpid()
    return pubsub


def forget_subscriber():
    pubsub, _local.pubsub = getattr(_local, 'pubsub', None), None
    if pubsub is not None:
        try:
            pubsub.close()
        except redis.RedisError:
            pass


def wait_for(call_id, is_finished, timeout):
    """Wait up to `timeout` s until `is_finished()` is true; return its last value.

    A message left over from an earlier wait of this thread only makes the loop look at the row once more.
    """
    if timeout <= 0:
        return is_finished()
    deadline = time.monotonic() + timeout
    name = channel(call_id)
    try:
        pubsub = subscriber()
        pubsub.subscribe(name)
    except redis.RedisError:
        forget_subscriber()
        pubsub = None
    try:
        while True:
            if is_finished():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pubsub is None:
                time.sleep(min(left, 0.05))
                continue
            try:
                pubsub.get_message(timeout=min(left, 1.0))
            except redis.RedisError:
                forget_subscriber()
                pubsub = None
    finally:
        if pubsub is not None:
            try:
                pubsub.unsubscribe(name)
            except redis.RedisError:
                forget_subscriber()
