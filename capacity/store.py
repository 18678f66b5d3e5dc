"""The lease-lane store: the one adapter between the limiter and Redis.

Each lane is a Redis sorted set of leases (member = lease token = the task id; score = expiry in epoch ms by
Redis's clock). The operations are Lua scripts in `capacity/lua/`, one per file. A `LaneStore` holds what a
process needs for them: its client, the registered scripts, the Redis thread every operation runs on (the
caller waits at most CAPACITY_REDIS_DEADLINE_SECONDS), the skip window after an error, and the releases
that wait for Redis to answer again (capacity.releases). `get_store()` is this process's store; tests give
their own with `use_store(LaneStore(client))`.

Where an operation runs. What no socket timeout bounds is making a connection: a DNS lookup, a walk through
the Sentinels, a connect. So connecting is done on the Redis thread, and the caller waits for it at most the
deadline. An operation on a connection that is already established is bounded by its socket timeout alone
(common.connections sets it to at most the deadline), so lane operations run on their caller's thread over one of the store's
established connections (`operate`): no thread hop on the path of an admission. An operation that finds
none idle runs on the Redis thread over a new connection, which it then leaves to the next caller; one that
fails on its connection closes it, so the next one connects again on the thread. Up to MAX_READY
connections per process are kept; beyond that operations run on the thread over the shared pool.

Errors: the store raises, it never decides to fail open (capacity.gate and capacity.lease do). It raises:
- `redis.TimeoutError` when Redis gave no answer within the deadline, or ran an acquire after its caller
  stopped waiting (no lease was taken then);
- `redis.ConnectionError` when the Redis thread's queue is full, or from redis-py;
- any other `redis.RedisError` from redis-py or from a script;
- `ValueError` for a call that makes no sense (no keys, keys and limits of different lengths).
"""
import functools
import importlib.resources
import threading
import time
from dataclasses import dataclass, field

import redis
from django.conf import settings

from capacity.keys import expired_key, hold_field, holds_key, lane_pattern, run_field
from capacity.releases import DeferredReleases
from capacity.threads import RedisThread
from common import connections
from common.process import PerProcess

SCRIPTS = ('acquire', 'renew', 'release', 'count', 'unclaim')
SCAN_COUNT = 100
MAX_READY = 32  # established connections per process that lane operations use on their caller's thread
NOT_AFTER_SLACK_SECONDS = 2  # room for the clocks of this host and Redis to differ
LATE_ACQUIRE = 'Redis ran the acquire after its caller stopped waiting; no lease was taken'
HOLD_WEIGHT = 0.2  # the newest release's weight in a lane's mean hold: about the last 5 releases count


@functools.cache
def read_script(name):
    """The Lua source of one operation, shipped as package data."""
    return importlib.resources.files('capacity').joinpath('lua', f'{name}.lua').read_text(encoding='utf-8')


def build_redis_client():
    """The limiter's own client: short timeouts, no retries, no health checks; Sentinel when configured."""
    return connections.build('lanes')


def release_call(keys, token, acquired_ms, ran):
    """The release script's keys and arguments (capacity/lua/release.lua)."""
    field_name, run_ms = (run_field(ran[0]), max(int(ran[1]), 0)) if ran is not None else ('', 0)
    args = [token, int(acquired_ms or 0), HOLD_WEIGHT, field_name, run_ms, *(hold_field(key) for key in keys)]
    return [*keys, holds_key()], args


def get_not_after_ms():
    """Epoch ms after which Redis must not run an acquire: the caller's deadline plus clock slack."""
    return int((time.time() + settings.CAPACITY_REDIS_DEADLINE_SECONDS + NOT_AFTER_SLACK_SECONDS) * 1000)


@dataclass(frozen=True)
class Acquired:
    """What an acquire did: whether it took the leases, and each lane's count before this call.

    Two readings come with it and are left out of comparisons (they are measurements, not the outcome):
    `acquired_ms`, Redis's clock when it ran (epoch ms: what a release measures the hold from), and, when
    a lane was full, `holds`: each lane's mean hold in ms (None where nothing was measured yet).
    """

    taken: bool
    counts: tuple[int, ...]
    acquired_ms: int = field(default=0, compare=False)
    holds: tuple[int | None, ...] = field(default=(), compare=False)


class Sending:
    """Which comes first for an operation the Redis thread connects for: its sending, or its caller giving up
    at the deadline. After `abandon()`, `send()` is False; after `send()`, `abandon()` changes nothing."""

    __slots__ = ('lock', 'sent', 'abandoned')

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = self.abandoned = False

    def send(self):
        with self.lock:
            if self.abandoned:
                return False
            self.sent = True
            return True

    def abandon(self):
        with self.lock:
            if not self.sent:
                self.abandoned = True


class LaneStore:
    """The lanes in Redis, for one process: one client, one Redis thread, one skip window."""

    def __init__(self, client=None):
        self._client = client  # None: the limiter's own client, built from settings on first use
        self._lock = threading.Lock()
        self._scripts = {}  # name -> redis.commands.core.Script, registered on `_scripts_client`
        self._scripts_client = None
        self._thread = None
        self._ready = []  # idle established single-connection clients, newest last
        self._opened = 0  # ready clients that exist (idle or in use)
        self.unavailable_until = 0.0  # time.monotonic() before which Redis is skipped
        self.releases = DeferredReleases(self)

    # --- state

    @property
    def client(self):
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = build_redis_client()  # connects lazily: no I/O under the lock
                client = self._client
        return client

    @property
    def thread(self):
        """This store's Redis thread, started on first use."""
        thread = self._thread
        if thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = RedisThread()
                thread = self._thread
        return thread

    def script(self, name):
        """The script `name` (a redis-py Script: it runs on any client of this Redis)."""
        client = self.client
        with self._lock:
            if self._scripts_client is not client:
                self._scripts, self._scripts_client = {}, client
            script = self._scripts.get(name)
            if script is None:
                # register_script only hashes the source; EVALSHA runs it and loads it on NOSCRIPT.
                script = self._scripts[name] = client.register_script(read_script(name))
            return script

    def is_available(self):
        return time.monotonic() >= self.unavailable_until

    def mark_unavailable(self):
        """Skip Redis for CAPACITY_REDIS_RETRY_SECONDS, so an outage costs each process one slow call."""
        self.unavailable_until = time.monotonic() + settings.CAPACITY_REDIS_RETRY_SECONDS

    # --- running operations

    def call(self, op, *args):
        """Run `op(*args)` on the Redis thread and wait at most the deadline for its answer.

        Socket timeouts don't bound a DNS lookup or a walk through the Sentinels; this does. On timeout a job
        still queued is cancelled (the thread skips it); one already running finishes unobserved.
        """
        deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
        job = self.thread.submit(op, *args)
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

    def operate(self, op, *args):
        """Run the lane operation `op(client, *args)`: on this thread over an established connection when
        one is idle, else on the Redis thread over a new one (see the module docstring). Either way it
        costs at most the deadline."""
        try:
            client = self._ready.pop()
        except IndexError:
            client = None
        if client is not None and not self._sound(client):
            self._discard(client)
            client = None
        if client is None:
            sending = Sending()
            started = time.monotonic()
            try:
                value, client = self.call(self._connect_and_run, op, args, sending)
            except redis.RedisError as ex:
                sending.abandon()  # a connection made after this never sends the operation
                deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
                if time.monotonic() - started < deadline - 0.02 or str(ex).startswith('no answer from Redis'):
                    raise
                # Connecting met a socket timeout equal to the deadline (the handshake, a Sentinel's
                # answer): to the caller it is the deadline, whichever of the two came first.
                raise redis.TimeoutError(f'no answer from Redis within {deadline} s') from ex
            if client is not None:
                self._ready.append(client)
            return value
        try:
            value = op(client, *args)
        except redis.ResponseError:
            self._ready.append(client)  # Redis answered: the connection is sound
            raise
        except redis.TimeoutError as ex:
            self._discard(client)
            deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
            if deadline < settings.CAPACITY_REDIS_TIMEOUT_SECONDS:
                raise redis.TimeoutError(f'no answer from Redis within {deadline} s') from ex
            raise
        except BaseException:
            self._discard(client)
            raise
        self._ready.append(client)
        return value

    def _connect_and_run(self, op, args, sending):
        """On the Redis thread: connect, then `op` over the new connection, returned with the value for the
        caller to keep (closed instead when MAX_READY are open). Nothing is sent when the caller gave up
        while this connected: an operation sent later than that could land after the release the caller's
        side sends for it (capacity.releases), and take leases nobody gives back."""
        with self._lock:
            opening = self._opened < MAX_READY
            if opening:
                self._opened += 1
        try:
            client = redis.Redis(connection_pool=self.client.connection_pool, single_connection_client=True)
        except BaseException:
            if opening:
                with self._lock:
                    self._opened -= 1
            raise
        keep = self._ready.append if opening else self._close
        if not sending.send():
            keep(client)  # sound, and idle
            raise redis.TimeoutError('the caller stopped waiting before the connection was made')
        try:
            value = op(client, *args)
        except redis.ResponseError:
            keep(client)  # Redis answered: the connection is sound
            raise
        except BaseException:
            self._discard(client) if opening else self._close(client)
            raise
        if opening:
            return value, client
        self._close(client)
        return value, None

    @staticmethod
    def _close(client):
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing
            pass

    @staticmethod
    def _sound(client):
        """Whether an idle client's connection is still usable: nothing unread, not closed by the server
        (redis-py's own check before it hands out a pooled connection; a poll, no round trip)."""
        try:
            return not client.connection.can_read(timeout=0)
        except Exception:  # noqa: BLE001 - closed or broken
            return False

    def _discard(self, client):
        """Close a ready client whose connection failed (or may have data left unread)."""
        with self._lock:
            self._opened -= 1
        try:
            client.connection.disconnect()
            client.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass

    def run_script(self, client, name, keys, args):
        """Run one Lua script on `client` (called through `operate`)."""
        return self.script(name)(keys=keys, args=args, client=client)

    def run_scan(self, pattern):
        keys = self.client.scan_iter(match=pattern, count=SCAN_COUNT)
        return sorted({key.decode() if isinstance(key, bytes) else key for key in keys})

    def run_command(self, client, name, args, kwargs):
        """One plain Redis command on `client` (called through `operate`)."""
        return getattr(client, name)(*args, **kwargs)

    def command(self, name, *args, **kwargs):
        """Run one plain Redis command within the deadline, e.g. command('set', key, value, nx=True, ex=10)."""
        return self.operate(self.run_command, name, args, kwargs)

    # --- operations

    def acquire(self, keys, limits, token, lease_ms, force, not_after_ms=None):
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
        args = [token, int(lease_ms), '1' if force else '0', int(not_after_ms), *limits,
                *(hold_field(key) for key in keys)]
        result = self.operate(self.run_script, 'acquire', [*keys, expired_key(), holds_key()], args)
        if int(result[0]) == -1:
            raise redis.TimeoutError(LATE_ACQUIRE)
        lanes = len(keys)
        holds = tuple(None if int(hold) < 0 else int(hold) for hold in result[2 + lanes:2 + 2 * lanes])
        return Acquired(taken=bool(int(result[0])), counts=tuple(int(count) for count in result[2:2 + lanes]),
                        acquired_ms=int(result[1]), holds=holds)

    def renew(self, keys, token, lease_ms):
        """Move every lease of `token` to expire `lease_ms` ms from now, only if all are held; return held."""
        keys = list(keys)
        if not keys:
            raise ValueError('renew needs at least one key')
        return int(self.operate(self.run_script, 'renew', keys, [token, int(lease_ms)]))

    def release(self, keys, token, acquired_ms=0, ran=None):
        """Remove the leases of `token`; return how many were removed (0 on a second release).

        With `acquired_ms` (Redis's clock at the acquire, Acquired.acquired_ms), each lane whose lease this
        removed measures how long it was held; with `ran` (queue, run_ms), the queue measures how long the
        call ran. Both in the release's own script: no round trip of their own.
        """
        keys = list(keys)
        if not keys and ran is None:
            return 0
        return int(self.operate(self.run_script, 'release', *release_call(keys, token, acquired_ms, ran)))

    def release_and_end(self, keys, token, acquired_ms=0, ran=None, notice=None, work=None):
        """A run's end in one round trip: `release`, then PUBLISH `notice` ((channel, message)) when given,
        then `end_work(*work)` when given, pipelined, so the pool process waits on Redis once where it
        waited three times (docs/benchmarks.md, section 10).

        Returns (removed, published, joined): each what its own command returned (`joined` as end_work's),
        or the exception it raised instead (an error in one doesn't undo the others). The pipeline failing
        as a whole (no answer in time) raises, and then any of them may have run.
        """
        return self.operate(self._run_end, list(keys), token, acquired_ms, ran, notice, work)

    def _run_end(self, client, keys, token, acquired_ms, ran, notice, work):
        """The pipeline of `release_and_end` on `client`. EVALSHA alone: a script Redis doesn't have (after a
        restart or SCRIPT FLUSH) is run again on its own, which loads it (a second round trip, rarely)."""
        steps = {}  # what -> (script name or None, keys, args), in the pipeline's order
        if keys or ran is not None:
            steps['removed'] = ('release', *release_call(keys, token, acquired_ms, ran))
        if notice is not None:
            steps['published'] = (None, [], list(notice))
        if work is not None:
            claim_key, work_token, pointer_key, pointer_ms, joined_key = work
            steps['joined'] = ('unclaim', [claim_key, pointer_key, joined_key], [work_token, int(pointer_ms)])
        pipe = client.pipeline(transaction=False)
        for name, step_keys, args in steps.values():
            if name is None:
                pipe.publish(*args)
            else:
                pipe.evalsha(self.script(name).sha, len(step_keys), *step_keys, *args)
        answers = dict(zip(steps, pipe.execute(raise_on_error=False)))
        for what, (name, step_keys, args) in steps.items():
            if isinstance(answers[what], redis.exceptions.NoScriptError):
                try:
                    answers[what] = self.run_script(client, name, step_keys, args)
                except redis.RedisError as ex:
                    answers[what] = ex
        removed, published, joined = (answers.get(what) for what in ('removed', 'published', 'joined'))
        if not isinstance(removed, Exception):
            removed = int(removed or 0)
        if joined is not None and not isinstance(joined, Exception):
            joined = bool(int(joined[1]))
        return removed, published, joined

    def count(self, keys):
        """Each lane's unexpired leases, in `keys` order (nothing is pruned)."""
        keys = list(keys)
        if not keys:
            return []
        return [int(count) for count in self.operate(self.run_script, 'count', keys, [])]

    def unclaim(self, key, token, pointer_key=None, pointer_ms=0):
        """Delete the claim `key` if `token` still holds it (True when it did); with `pointer_key` and
        `pointer_ms` > 0, also point `pointer_key` at `token` for that long, in the same script."""
        keys, args = [key], [token]
        if pointer_key is not None:
            keys, args = [key, pointer_key], [token, int(pointer_ms)]
        return bool(int(self.operate(self.run_script, 'unclaim', keys, args)))

    def end_work(self, key, token, pointer_key, pointer_ms, joined_key):
        """`unclaim` for a leader that ended, which also takes its joined mark (`joined_key`) away: True
        when a call had marked it (joined the work), in the same script."""
        removed, joined = self.operate(self.run_script, 'unclaim', [key, pointer_key, joined_key],
                                       [token, int(pointer_ms)])
        return bool(int(joined))

    def find_keys(self, lane):
        """Every key of a lane that has parts (e.g. each host's api_heavy_task key), sorted."""
        return self.call(self.run_scan, lane_pattern(lane))

    def holds(self):
        """{field: mean ms} of every measurement in the hold-time hash (capacity.keys.hold_field and
        run_field name them), without the sample counts."""
        raw = self.command('hgetall', holds_key())
        means = {}
        for name, value in raw.items():
            name = name.decode() if isinstance(name, bytes) else name
            if '|' not in name:
                means[name] = int(value)
        return means

    def expired_total(self):
        """How many leases acquire found expired (never released) since the counter began."""
        return int(self.command('get', expired_key()) or 0)


_stores = PerProcess(LaneStore)


def get_store():
    """This process's lane store (a new one in a forked child)."""
    return _stores.get()


def use_store(store):
    """Use `store` in this process from now on (tests); None makes a fresh one from settings."""
    old = _stores.peek()
    if old is not None:
        old.releases.clear()
    return _stores.set(store if store is not None else LaneStore())
