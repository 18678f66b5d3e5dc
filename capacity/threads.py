"""The per-process daemon thread that runs every capacity Redis operation.

A caller waits for its operation at most a deadline (capacity.store), because socket timeouts don't bound a
DNS lookup or a walk through the Sentinels. The thread is a daemon so an operation stuck in DNS never holds
up a process's exit (a ThreadPoolExecutor thread would: the interpreter joins those at exit). Its queue is
short: when it is full, the caller fails at once instead of waiting behind a stuck operation.

This module imports nothing from Django, so a subprocess test can check that a process exits.
"""
import queue
import threading
from concurrent.futures import Future

import redis

MAX_QUEUED = 8


class RedisThread:
    def __init__(self, max_queued=MAX_QUEUED):
        self.jobs = queue.Queue(maxsize=max_queued)
        self.thread = threading.Thread(target=self.run, name='ocl-capacity-redis', daemon=True)
        self.thread.start()

    def submit(self, op, *args):
        """Queue `op(*args)`; return its Future. Raises redis.ConnectionError at once when the queue is full."""
        future = Future()
        try:
            self.jobs.put_nowait((future, op, args))
        except queue.Full:
            raise redis.ConnectionError('the capacity Redis thread is busy') from None
        return future

    def run(self):
        while True:
            future, op, args = self.jobs.get()
            # False when the caller gave up (cancelled) before the job started: skip it.
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(op(*args))
            except BaseException as ex:  # noqa: BLE001 - handed to the caller, who decides
                future.set_exception(ex)
