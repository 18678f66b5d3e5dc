"""Releases that couldn't reach Redis, sent again once it answers.

While a process skips Redis after an error (the skip window, capacity.store), or when a release itself
fails, the lease would otherwise stay until it expires. A queued call's leases last until its queue
deadline (10 minutes by default), so a call that started and ended during an outage would go on counting
in its lanes long after it finished. Instead its release waits here, and a daemon thread per process sends
it when the skip window has passed. A release is idempotent (ZREM), so sending one that Redis ran after
all (its caller gave up at the deadline) changes nothing.

At most MAX_DEFERRED tokens wait; beyond that the oldest are dropped and left to expire, like releases
that wait in a process that exits.
"""
import logging
import os
import threading
import time

import redis

from capacity.store import RedisLanes

logger = logging.getLogger('heavy_lanes')
MAX_DEFERRED = 10_000

_pending = {}  # token -> keys to release, oldest first
_lock = threading.Lock()
_wake = threading.Event()
_thread = None
_thread_pid = None


def defer(keys, token):
    """Release `token` from `keys` once Redis can be reached again."""
    global _thread, _thread_pid
    keys = list(keys)
    if not keys:
        return
    with _lock:
        known = _pending.pop(token, [])
        _pending[token] = known + [key for key in keys if key not in known]
        while len(_pending) > MAX_DEFERRED:
            dropped = next(iter(_pending))
            del _pending[dropped]
            logger.warning('Deferred release of %s dropped: too many waiting; its leases expire', dropped)
        if _thread is None or _thread_pid != os.getpid() or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name='ocl-capacity-release', daemon=True)
            _thread_pid = os.getpid()
            _thread.start()
    _wake.set()


def pending():
    """{token: keys} still waiting (tests)."""
    with _lock:
        return {token: list(keys) for token, keys in _pending.items()}


def clear():
    """Forget every waiting release (tests; RedisLanes.use_client)."""
    with _lock:
        _pending.clear()


def _take():
    with _lock:
        batch = list(_pending.items())
        _pending.clear()
    return batch


def _put_back(batch):
    with _lock:
        for token, keys in batch:
            _pending.setdefault(token, keys)


def _run():
    while True:
        _wake.wait()
        delay = RedisLanes.unavailable_until - time.monotonic()
        if delay > 0:
            # The event stays set: look again soon (the window may be shortened, e.g. reset by use_client).
            time.sleep(min(delay + 0.05, 0.5))
            continue
        _wake.clear()  # before taking: a release deferred from now on sets it again
        send(_take())


def send(batch):
    """Release each (token, keys) of `batch`; on a Redis error keep the rest for the next window."""
    for index, (token, keys) in enumerate(batch):
        try:
            RedisLanes.release(keys, token)
        except redis.RedisError as ex:
            RedisLanes.mark_unavailable()
            _put_back(batch[index:])
            _wake.set()
            logger.warning('Deferred releases wait for Redis again (%s: %s)', type(ex).__name__, ex)
            return
        except Exception:  # noqa: BLE001 - a bad entry must not stop the others
            logger.exception('Deferred release of %s failed; its leases expire', token)


def _after_fork():
    global _lock, _wake, _thread, _thread_pid
    _lock = threading.Lock()
    _wake = threading.Event()
    _pending.clear()
    _thread, _thread_pid = None, None


os.register_at_fork(after_in_child=_after_fork)
