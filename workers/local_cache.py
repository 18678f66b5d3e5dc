"""Facts every heavy call reads from the database, kept in each process while no change to them can go
unheard: the caller's token (api.authentication) and what the work key takes of the source a `$match`
reads (workers.sharing.work_key).

    tokens = LocalCache('token')
    user, token = tokens.get(key, lambda: load(key))   # read through; kept while the hub is connected
    changed('token', key)                               # every process drops it once the change commits

Read every time, the two cost a database round trip each per call: under load, a third of an API
process's time before a call's row (docs/benchmarks.md, 2026-12-03). A kept fact must not outlive a change:
- A change is announced on its channel (capacity.keys.invalidation_channel) after its transaction commits
  (`changed`, called from the models' signals: api.apps, workers.apps); each process's notice hub
  (workers.notify) hears it and its listener here drops the fact. The process that made the change drops
  it at once as well.
- A process keeps and answers nothing from here while its hub isn't subscribed, and drops all it kept
  when the hub connects and when it loses the connection: a change made meanwhile went unheard.
- A fact read before a change and stored after the change's message came would be stale: every drop moves
  a generation counter, and a read during which it moved is not kept.
- What no message covers is bounded by HEAVY_LANES_LOCAL_CACHE_SECONDS (30 s by default; 0 keeps nothing):
  a change whose announcement failed (Redis unreachable from the writer alone), a half-open subscription
  the hub hasn't noticed yet (notify.STALE_SECONDS), a `QuerySet.update()`, which sends no signal.

Written by hand: Django's local-memory cache has no invalidation across processes, a shared cache (Redis)
costs the round trip this saves, and redis-py's client-side caching tracks Redis keys, not database rows.
"""
import logging
import threading
import time

import redis
from django.conf import settings
from django.db import transaction

from capacity.keys import invalidation_channel
from common import connections
from common.process import PerProcess
from workers import notify

logger = logging.getLogger('heavy_lanes')
TOKEN, SOURCE = 'token', 'source'  # the kinds of facts kept: api.authentication, workers.sharing
MAX_ENTRIES = 10_000  # per process, all names together; reaching it empties the cache (the next calls refill it)


class Kept:
    """This process's kept facts, and the listener the notice hub tells of invalidations."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries = {}  # (name, key) -> (value, monotonic expiry)
        self.generation = 0
        self.hub = None  # the hub this listens to (one per process; tests may make others)

    def connected(self):
        self.drop()

    def lost(self):
        self.drop()

    def invalidated(self, data):
        text = data.decode(errors='replace') if isinstance(data, bytes) else str(data)
        name, _, key = text.partition('\n')
        self.drop(name or None, key or None)

    def drop(self, name=None, key=None):
        """Forget `name`'s `key`, all of `name` (key None), or everything (name None)."""
        with self.lock:
            self.generation += 1
            if name is None:
                self.entries.clear()
            elif key is None:
                for entry in [entry for entry in self.entries if entry[0] == name]:
                    del self.entries[entry]
            else:
                self.entries.pop((name, key), None)

    def listening_hub(self):
        """The process's notice hub, told to tell this of invalidations (once per hub)."""
        hub = notify.get_hub()
        if self.hub is not hub:
            hub.listen_for_invalidations(self)
            self.hub = hub
        return hub


_kept = PerProcess(Kept)


class LocalCache:
    """Facts of one kind (`name`), read through `load` and kept as the module docstring says.

    A value is shared by the threads of the process: keep only what no caller changes, or copy it out."""

    def __init__(self, name):
        self.name = name

    def get(self, key, load):
        """`load()`'s value for `key`, from this process when it is kept; exceptions of `load` pass through
        and nothing is kept for them."""
        seconds = settings.HEAVY_LANES_LOCAL_CACHE_SECONDS
        if seconds <= 0:
            return load()
        kept = _kept.get()
        hub = kept.listening_hub()
        if not hub.connected.is_set():
            return load()
        now = time.monotonic()
        entry = kept.entries.get((self.name, key))
        if entry is not None and entry[1] > now:
            return entry[0]
        generation = kept.generation
        value = load()
        with kept.lock:
            if kept.generation == generation and hub.connected.is_set():
                if len(kept.entries) >= MAX_ENTRIES:
                    kept.entries.clear()
                kept.entries[(self.name, key)] = (value, now + seconds)
        return value


def changed(name, key=None, using=None):
    """Say that `name`'s fact `key` (None: every fact of `name`) changed in the current transaction: dropped
    in this process now, and in every process once the transaction commits (at once outside one)."""
    _kept.get().drop(name, key)
    transaction.on_commit(lambda: announce(name, key), using=using)


def announce(name, key=None):
    """Tell every process to drop `name`'s `key` (None: all of `name`). Never raises: a failed announcement
    is logged, and what other processes kept goes stale for at most HEAVY_LANES_LOCAL_CACHE_SECONDS."""
    _kept.get().drop(name, key)  # a thread of this process may have read it again before the commit
    try:
        connections.connect('notices').publish(invalidation_channel(), f'{name}\n{key or ""}')
    except redis.RedisError as ex:
        logger.warning('Could not announce a change of %s (%s: %s); other processes may keep the old one for up '
                       'to %s s', name, type(ex).__name__, ex, settings.HEAVY_LANES_LOCAL_CACHE_SECONDS)


def forget():
    """Drop everything this process kept (tests, which roll back what they changed without a signal)."""
    _kept.get().drop()
