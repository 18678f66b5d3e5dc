"""Releases that couldn't reach Redis, sent again as soon as it answers.

A lease the API or a worker could not release (an error, or the skip window after one) would otherwise
count until it expires, and a queued call's leases last until its queue deadline (10 minutes by default).
An acquire whose answer never came is released the same way: Redis may still run it from its input buffer
after the caller gave up (a paused Redis runs it when it resumes), and the release sent after Redis answers
again lands after it. A release is idempotent (ZREM), so sending one that Redis ran after all, or one for
an acquire that never ran, changes nothing.

A daemon thread per store sends what waits: at once, then every RETRY_SECONDS while Redis keeps failing.
It is not a call, so the skip window (which keeps calls off a failing Redis) doesn't hold it back: a lease
Redis took late is gone within RETRY_SECONDS of Redis answering again. At most MAX_DEFERRED tokens wait;
beyond that the oldest are dropped and left to expire, like releases that wait in a process that exits.
"""
import logging
import threading
import time

import redis

logger = logging.getLogger('heavy_lanes')
MAX_DEFERRED = 10_000
RETRY_SECONDS = 0.5


class DeferredReleases:
    """The releases one lane store still owes Redis, and the thread that sends them."""

    def __init__(self, store):
        self.store = store
        self._pending = {}  # token -> keys to release, oldest first
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None

    def defer(self, keys, token):
        """Release `token` from `keys` once Redis can be reached again."""
        keys = list(keys)
        if not keys:
            return
        with self._lock:
            known = self._pending.pop(token, [])
            self._pending[token] = known + [key for key in keys if key not in known]
            while len(self._pending) > MAX_DEFERRED:
                dropped = next(iter(self._pending))
                del self._pending[dropped]
                logger.warning('Deferred release of %s dropped: too many waiting; its leases expire', dropped)
            self._ensure_thread()
        self._wake.set()

    def _ensure_thread(self):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name='ocl-capacity-release', daemon=True)
            self._thread.start()

    def pending(self):
        """{token: keys} still waiting (tests)."""
        with self._lock:
            return {token: list(keys) for token, keys in self._pending.items()}

    def clear(self):
        """Forget every waiting release (tests)."""
        with self._lock:
            self._pending.clear()

    def _take(self):
        with self._lock:
            batch = list(self._pending.items())
            self._pending.clear()
        return batch

    def _put_back(self, batch):
        with self._lock:
            for token, keys in batch:
                self._pending.setdefault(token, keys)

    def _run(self):
        failing = False
        while True:
            self._wake.wait()
            self._wake.clear()  # before taking: a release deferred from now on sets it again
            error = self.send(self._take())
            if error is None:
                if failing:
                    logger.info('Deferred releases sent: Redis answers again')
                failing = False
                continue
            if not failing:
                logger.warning('Deferred releases wait for Redis (%s); retrying every %s s', error, RETRY_SECONDS)
            failing = True
            self._wake.set()
            time.sleep(RETRY_SECONDS)

    def send(self, batch):
        """Release each (token, keys) of `batch`; on a Redis error keep the rest and return the error."""
        for index, (token, keys) in enumerate(batch):
            try:
                self.store.ops.release(keys, token)  # the raw release: this is where a failed one ends up
            except redis.RedisError as ex:
                self.store.suspect(ex)
                self._put_back(batch[index:])
                return f'{type(ex).__name__}: {ex}'
            except Exception:  # noqa: BLE001 - a bad entry must not stop the others
                logger.exception('Deferred release of %s failed; its leases expire', token)
        return None
