"""Running one Redis operation of the limiter within its deadline (CAPACITY_REDIS_DEADLINE_SECONDS).

What no socket timeout bounds is making a connection: a DNS lookup, a walk through the Sentinels, a connect.
So connecting is done on the Redis thread (capacity.threads.RedisThread), and the caller waits for it at most
the deadline. An operation on a connection that is already established is bounded by its socket timeout
alone (common.connections sets it to at most the deadline), so operations run on their caller's thread over
one of the runner's established connections (`operate`): no thread hop on the path of an admission. An
operation that finds none idle runs on the Redis thread over a new connection, which it then leaves to the
next caller; one that fails on its connection closes it, so the next one connects again on the thread. Up to
MAX_READY connections per process are kept; beyond that operations run on the thread over the shared pool.

An operation that was sent is waited for until its answer comes or its socket timeout ends it, even past the
deadline: a process that got no CPU for a while (a busy host, a SIGSTOP) finds the answer Redis gave in its
socket when it runs again, and that answer counts. The deadline ends only the wait for an operation not yet
sent (connecting, or queued behind the thread).

Errors are raised, never decided on here (capacity.store applies the fail-open rule):
- `redis.TimeoutError` when Redis gave no answer to an operation sent (its socket timeout, or the deadline
  when that is shorter);
- `Unsent` (a redis.TimeoutError) when the deadline passed before the operation could be sent: Redis may be
  unreachable (a DNS lookup or a Sentinel that hangs) or this process may just be behind; only the probe can
  tell (capacity.breaker);
- `capacity.threads.Busy` (a redis.ConnectionError) when the Redis thread's queue is full;
- any other `redis.RedisError` from redis-py.

Written by hand: redis-py bounds reads by socket timeouts but not connecting, and has no notion of a caller
that stops waiting (an operation sent after its caller gave up could take leases nobody gives back).
"""
import threading
import time

import redis
from django.conf import settings

from capacity.threads import RedisThread

# Established connections per process that operations use on their caller's thread: more than an API process
# has threads (API_THREADS, 64 by default), so a burst never queues its operations behind the one Redis thread
# (with 32, a flood of 64 threads per process queued half of them there past the deadline). Connections are
# made only as threads need them at once, so this is a ceiling, not a cost.
MAX_READY = 256
# How long a caller waits on for an operation that was sent, past the deadline, when its process is starved:
# the operation's own socket timeout ends it far sooner on a process that runs; this only bounds a bug.
SENT_WAIT_SECONDS = 30


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
        """Give up on the operation unless it was sent; True when it will never be sent."""
        with self.lock:
            if not self.sent:
                self.abandoned = True
            return self.abandoned


class Unsent(redis.TimeoutError):
    """The deadline passed before the operation was sent: nothing reached Redis, and nothing says whether
    Redis or this process was slow."""


def unsent_error(deadline):
    return Unsent(f'no answer from Redis within {deadline} s')


def deadline_error(deadline):
    return redis.TimeoutError(f'no answer from Redis within {deadline} s')


class Runner:
    """One process's way to Redis for the limiter: a client (given, or built on first use by `build`), the
    Redis thread, and the established connections kept for callers' threads."""

    def __init__(self, client=None, build=None):
        self._client = client
        self._build = build
        self._lock = threading.Lock()
        self._thread = None
        self._ready = []  # idle established single-connection clients, newest last
        self._opened = 0  # ready clients that exist (idle or in use)

    @property
    def client(self):
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._build()  # connects lazily: no I/O under the lock
                client = self._client
        return client

    @property
    def thread(self):
        """This runner's Redis thread, started on first use."""
        thread = self._thread
        if thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = RedisThread()
                thread = self._thread
        return thread

    def call(self, op, *args, sending=None):
        """Run `op(*args)` on the Redis thread and wait at most the deadline for its answer, or, with
        `sending` (the op's Sending), until the op ends once it was sent.

        Socket timeouts don't bound a DNS lookup or a walk through the Sentinels; this does. On timeout a job
        still queued is cancelled (the thread skips it); one already running finishes unobserved.
        """
        deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
        job = self.thread.submit(op, *args)
        try:
            return job.result(timeout=deadline)
        except TimeoutError:
            # result() raises the builtin TimeoutError both at its deadline and when the op itself raised
            # one (socket.timeout is one); a job that is done tells them apart.
            if job.done():
                return job.result()
        if sending is not None and not sending.abandon():
            # Sent: Redis has it, and its answer (or the op's socket timeout) ends the op; a process that
            # got no CPU past the deadline reads an answer that waited in its socket.
            try:
                return job.result(timeout=SENT_WAIT_SECONDS)
            except TimeoutError:
                if job.done():
                    return job.result()
                raise deadline_error(deadline) from None
        # cancel() is True for a job still queued; False for one running, or one that finished just now,
        # whose answer is then used rather than thrown away.
        if job.cancel() or not job.done():
            raise unsent_error(deadline) if sending is not None else deadline_error(deadline)
        return job.result()

    def operate(self, op, *args):
        """Run `op(client, *args)`: on this thread over an established connection when one is idle, else on
        the Redis thread over a new one (see the module docstring). Either way it waits at most the
        deadline to be sent."""
        try:
            client = self._ready.pop()
        except IndexError:
            client = None
        if client is not None and not self._sound(client):
            self._discard(client)
            client = None
        if client is None:
            return self._operate_new(op, args)
        try:
            value = op(client, *args)
        except redis.ResponseError:
            self._ready.append(client)  # Redis answered: the connection is sound
            raise
        except redis.TimeoutError as ex:
            self._discard(client)
            deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
            if deadline < settings.CAPACITY_REDIS_TIMEOUT_SECONDS:
                raise deadline_error(deadline) from ex
            raise
        except BaseException:
            self._discard(client)
            raise
        self._ready.append(client)
        return value

    def _operate_new(self, op, args):
        sending = Sending()
        started = time.monotonic()
        try:
            value, client = self.call(self._connect_and_run, op, args, sending, sending=sending)
        except redis.RedisError as ex:
            sending.abandon()  # a connection made after this never sends the operation
            deadline = settings.CAPACITY_REDIS_DEADLINE_SECONDS
            if time.monotonic() - started < deadline - 0.02 or str(ex).startswith('no answer from Redis'):
                raise
            if not sending.sent:
                raise unsent_error(deadline) from ex
            # Connecting met a socket timeout equal to the deadline (the handshake, a Sentinel's answer): to
            # the caller it is the deadline, whichever of the two came first.
            raise deadline_error(deadline) from ex
        if client is not None:
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
