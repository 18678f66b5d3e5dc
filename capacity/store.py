"""The lease-lane store: the one adapter between the limiter and Redis.

Each lane is a Redis sorted set of leases (member = lease token = the task id; score = expiry in epoch ms by
Redis's clock). The operations are Lua scripts in `capacity/lua/`, one per file. `RedisLanes` holds the
per-process state (client, registered scripts, Redis thread, skip window) and runs every Redis operation on
the per-process `RedisThread`, waiting at most CAPACITY_REDIS_DEADLINE_SECONDS for it.

Errors: the store raises, it never decides to fail open (the gate does). What it raises:
- `redis.TimeoutError` when Redis gave no answer within the deadline, or ran an acquire after its caller
  stopped waiting (no lease was taken then);
- `redis.ConnectionError` when the Redis thread's queue is full, or from redis-py;
- any other `redis.RedisError` from redis-py or from a script;
- `ValueError` for a call that makes no sense (no keys, keys and limits of different lengths).
`mark_unavailable()` / `is_available()` keep the skip window the gate reads.
"""
import functools
import importlib.resources
import os
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from capacity.keys import expired_key, lane_pattern
from capacity.threads import RedisThread

SCRIPTS = ('acquire', 'renew', 'release', 'count')
SCAN_COUNT = 100
NOT_AFTER_SLACK_SECONDS = 2  # room for the clocks of this host and Redis to differ
LATE_ACQUIRE = 'Redis ran the acquire after its caller stopped waiting; no lease was taken'


@functools.cache
def read_script(name):
    """The Lua source of one operation, shipped as package data."""
    return importlib.resources.files('capacity').joinpath('lua', f'{name}.lua').read_text(encoding='utf-8')


def build_redis_client():
    """The limiter's own client: short timeouts, no retries, no health checks; Sentinel when configured.

    `retry_on_timeout=False` from the original is left out: redis-py 8 deprecates it (a DeprecationWarning)
    and `Retry(NoBackoff(), 0)` already means no retry after a timeout or any other error.
    """
    timeout = settings.CAPACITY_REDIS_TIMEOUT_SECONDS
    options = {
        'socket_timeout': timeout,
        'socket_connect_timeout': timeout,
        'retry': Retry(NoBackoff(), 0),
        'health_check_interval': 0,
    }
    if settings.REDIS_SENTINELS:
        sentinel_kwargs = {'socket_timeout': timeout, 'socket_connect_timeout': timeout,
                           'retry': Retry(NoBackoff(), 0)}
        if settings.REDIS_PASSWORD:
            sentinel_kwargs['password'] = settings.REDIS_PASSWORD
        sentinel = Sentinel(settings.REDIS_SENTINELS_LIST, sentinel_kwargs=sentinel_kwargs)
        return sentinel.master_for(settings.REDIS_SENTINELS_MASTER, db=settings.REDIS_DB,
                                   password=settings.REDIS_PASSWORD, **options)
    return redis.Redis(host=settings.REDIS_HOST, port=int(settings.REDIS_PORT), db=settings.REDIS_DB,
                       password=settings.REDIS_PASSWORD, **options)


def get_not_after_ms():
    """Epoch ms after which Redis must not run an acquire: the caller's deadline plus clock slack."""
    return int((time.time() + settings.CAPACITY_REDIS_DEADLINE_SECONDS + NOT_AFTER_SLACK_SECONDS) * 1000)


@dataclass(frozen=True)
class Acquired:
    """What an acquire did: whether it took the leases, and each lane's count before this call."""

    taken: bool
    counts: tuple[int, ...]


class RedisLanes:
    """The lanes in Redis, one state per process (class attributes), used through classmethods."""

    lock = threading.Lock()
    client = None
    scripts = {}  # name -> redis.commands.core.Script, registered on `scripts_client`
    scripts_client = None
    thread = None
    thread_pid = None
    unavailable_until = 0.0  # time.monotonic() before which Redis is skipped

    # --- state

    @classmethod
    def get_client(cls):
        client = cls.client
        if client is None:
            with cls.lock:
                if cls.client is None:
                    cls.client = build_redis_client()  # connects lazily: no I/O under the lock
                client = cls.client
        return client

    @classmethod
    def use_client(cls, client):
        """Use `client` from now on (tests; None builds one from settings on next use)."""
        with cls.lock:
            cls.client = client
            cls.scripts, cls.scripts_client = {}, None
            cls.unavailable_until = 0.0
            cls.thread, cls.thread_pid = None, None
        from capacity import releases  # it imports this module
        releases.clear()

    @classmethod
    def get_script(cls, name, client):
        """The script `name` registered on `client` (again when the client changed)."""
        with cls.lock:
            if cls.scripts_client is not client:
                cls.scripts, cls.scripts_client = {}, client
            script = cls.scripts.get(name)
            if script is None:
                # register_script only hashes the source; EVALSHA runs it and loads it on NOSCRIPT.
                script = cls.scripts[name] = client.register_script(read_script(name))
            return script

    @classmethod
    def get_redis_thread(cls):
        """This process's Redis thread, started on first use and again in a forked child."""
        pid = os.getpid()
        thread = cls.thread
        if thread is None or cls.thread_pid != pid:
            with cls.lock:
                if cls.thread is None or cls.thread_pid != pid:
                    cls.thread, cls.thread_pid = RedisThread(), pid
                thread = cls.thread
        return thread

    @classmethod
    def after_fork(cls):
        # A lock some other thread of the parent held at fork time stays locked forever in the child.
        cls.lock = threading.Lock()

    @classmethod
    def is_available(cls):
        return time.monotonic() >= cls.unavailable_until

    @classmethod
    def mark_unavailable(cls):
        """Skip Redis for CAPACITY_REDIS_RETRY_SECONDS, so an outage costs each process one slow call."""
        cls.unavailable_until = time.monotonic() + settings.CAPACITY_REDIS_RETRY_SECONDS

    # --- running operations

    @classmethod
    def call(cls, op, *args):
        """Run `op(*args)` on the Redis thread and wait at most the deadline for its answer.

        Socket timeouts don't bound a DNS lookup or a walk through the Sentinels; this does. On timeout a job
        still queued is cancelled (the thread skips it); one already running finishes unobserved.
        """
        deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
        job = cls.get_redis_thread().submit(op, *args)
        try:
            return job.result(timeout=deadline)
        except TimeoutError:
            # result() raises the builtin TimeoutError both at its deadline and when the op itself raised
            # one (socket.timeout is one); a job that is done tells them apart. cancel() is True for a
            # job still queued; False for one running, or one that finished just now, whose answer is
            # then used rather than thrown away.
            if not job.done() and (job.cancel() or not job.done()):
                raise redis.TimeoutError(f'no answer from Redis within {deadline} s') from None
            return job.result()

    @classmethod
    def run_script(cls, name, keys, args):
        """Run one Lua script (on the Redis thread: called through `call`)."""
        client = cls.get_client()
        return cls.get_script(name, client)(keys=keys, args=args, client=client)

    @classmethod
    def run_scan(cls, pattern):
        keys = cls.get_client().scan_iter(match=pattern, count=SCAN_COUNT)
        return sorted({key.decode() if isinstance(key, bytes) else key for key in keys})

    @classmethod
    def run_get(cls, key):
        return cls.get_client().get(key)

    # --- operations

    @classmethod
    def acquire(cls, keys, limits, token, lease_ms, force, not_after_ms=None):
        """Take a lease (expiring in `lease_ms` ms) in every lane of `keys`, or in none.

        `limits` are the lanes' limits, in `keys` order. Not forced, a call takes nothing when a lane is full
        (count >= limit). `not_after_ms` (epoch ms) defaults to get_not_after_ms(); Redis running the script
        later than that raises redis.TimeoutError and takes nothing.
        """
        keys, limits = list(keys), [int(limit) for limit in limits]
        if not keys or len(keys) != len(limits):
            raise ValueError(f'acquire needs keys and one limit per key, got {len(keys)} keys and '
                             f'{len(limits)} limits')
        if not_after_ms is None:
            not_after_ms = get_not_after_ms()
        args = [token, int(lease_ms), '1' if force else '0', int(not_after_ms), *limits]
        result = cls.call(cls.run_script, 'acquire', [*keys, expired_key()], args)
        if int(result[0]) == -1:
            raise redis.TimeoutError(LATE_ACQUIRE)
        return Acquired(taken=bool(int(result[0])), counts=tuple(int(count) for count in result[1:]))

    @classmethod
    def renew(cls, keys, token, lease_ms):
        """Move every lease of `token` to expire `lease_ms` ms from now, only if all are held; return held."""
        keys = list(keys)
        if not keys:
            raise ValueError('renew needs at least one key')
        return int(cls.call(cls.run_script, 'renew', keys, [token, int(lease_ms)]))

    @classmethod
    def release(cls, keys, token):
        """Remove the leases of `token`; return how many were removed (0 on a second release)."""
        keys = list(keys)
        if not keys:
            return 0
        return int(cls.call(cls.run_script, 'release', keys, [token]))

    @classmethod
    def count(cls, keys):
        """Each lane's unexpired leases, in `keys` order (nothing is pruned)."""
        keys = list(keys)
        if not keys:
            return []
        return [int(count) for count in cls.call(cls.run_script, 'count', keys, [])]

    @classmethod
    def find_keys(cls, lane):
        """Every key of a lane that has parts (e.g. each host's api_heavy_task key), sorted."""
        return cls.call(cls.run_scan, lane_pattern(lane))

    @classmethod
    def expired_total(cls):
        """How many leases acquire found expired (never released) since the counter began."""
        return int(cls.call(cls.run_get, expired_key()) or 0)


os.register_at_fork(after_in_child=RedisLanes.after_fork)
