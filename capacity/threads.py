"""The per-process daemon thread that runs the capacity Redis operations that connect (and the publishes).

A caller waits for its operation at most a deadline (capacity.store), because socket timeouts don't bound a
DNS lookup or a walk through the Sentinels. The thread is a daemon so an operation stuck in DNS never holds
up a process's exit (a ThreadPoolExecutor thread would: the interpreter joins those at exit). Its queue is
bounded: when it is full, the caller fails at once instead of waiting behind a stuck operation.

The same thread class runs the broker's publishes (workers.publisher), for the same reason.

The lane store hands it only what needs connecting (capacity.store.LaneStore.operate); the hand-off is
still on the path of every broker publish, so it is built from the cheapest primitives CPython has:
a C `SimpleQueue` for the jobs and, per job, two plain locks instead of a `concurrent.futures.Future` (whose
Condition allocates and notifies waiter locks in Python). `Job` keeps the part of the Future interface the
callers use: result(timeout), cancel(), done(), running(). bench/admission.py measures the difference.

This module imports nothing from Django, so a subprocess test can check that a process exits.
"""
import queue
import threading
from concurrent.futures import CancelledError

import redis

# Room for every thread of an API process (API_THREADS, 64 by default) to wait for a connection at once: a
# burst of calls into a process that has no established connection yet must not find the thread "busy"
# (that fails the call open and opens the skip window). A stuck thread still costs each caller the deadline.
MAX_QUEUED = 64

QUEUED, RUNNING, FINISHED, CANCELLED = 'queued', 'running', 'finished', 'cancelled'


class Busy(redis.ConnectionError):
    """The thread's queue is full: this process is behind, which says nothing about Redis (capacity.failopen
    doesn't open the skip window for it without the probe's word)."""


class Job:
    """One operation handed to the Redis thread; whoever takes `claim` first runs it or cancels it."""

    __slots__ = ('op', 'args', 'state', 'value', 'error', 'claim', 'finished')

    def __init__(self, op, args):
        self.op, self.args = op, args
        self.state = QUEUED
        self.value = self.error = None
        self.claim = threading.Lock()  # taken by the thread (to run) or the caller (to cancel), once
        self.finished = threading.Lock()  # held until the job has ended
        self.finished.acquire()

    def run(self):
        """Run the job on the Redis thread, unless its caller cancelled it first."""
        if not self.claim.acquire(blocking=False):
            return
        self.state = RUNNING
        try:
            self.value = self.op(*self.args)
        except BaseException as ex:  # noqa: BLE001 - handed to the caller, who decides
            self.error = ex
        self.state = FINISHED
        self.finished.release()

    def cancel(self):
        """Stop a job that hasn't started: True when it will never run, False when it ran or runs."""
        if self.state == CANCELLED:
            return True
        if not self.claim.acquire(blocking=False):
            return False
        self.state = CANCELLED
        self.finished.release()
        return True

    def done(self):
        return self.state in (FINISHED, CANCELLED)

    def running(self):
        return self.state == RUNNING

    def result(self, timeout=None):
        """The job's value (or its exception raised here); TimeoutError if it hasn't ended within `timeout`."""
        if not self.finished.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise TimeoutError()
        self.finished.release()  # later calls return at once
        if self.state == CANCELLED:
            raise CancelledError()
        if self.error is not None:
            raise self.error
        return self.value


class RedisThread:
    """One daemon thread running Redis operations in turn; `name` says whose (the lane store's, the
    publisher's)."""

    def __init__(self, max_queued=MAX_QUEUED, name='ocl-capacity-redis', busy='the capacity Redis thread is busy'):
        self.max_queued = max_queued
        self.busy = busy
        self.jobs = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)
        self.thread.start()

    def submit(self, op, *args):
        """Queue `op(*args)`; return its Job. Raises Busy (a redis.ConnectionError) at once when the queue is full."""
        # Two callers may both see one place left and both queue: the bound is kept to within the number of
        # threads of a process, which is what "short" needs.
        if self.jobs.qsize() >= self.max_queued:
            raise Busy(self.busy)
        job = Job(op, args)
        self.jobs.put(job)
        return job

    def run(self):
        while True:
            self.jobs.get().run()
