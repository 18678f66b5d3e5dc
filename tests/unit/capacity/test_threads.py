"""The per-process Redis thread: a short queue that refuses at once, and skips jobs nobody waits for."""
import threading
import time

import pytest
import redis

from capacity.threads import RedisThread


@pytest.fixture
def gate():
    event = threading.Event()
    yield event
    event.set()


def test_a_full_queue_fails_at_once(gate):
    thread = RedisThread(max_queued=1)
    running = threading.Event()
    thread.submit(lambda: (running.set(), gate.wait()))
    assert running.wait(2)
    thread.submit(gate.wait)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match='the capacity Redis thread is busy'):
        thread.submit(gate.wait)
    assert time.monotonic() - started < 0.1


def test_a_job_cancelled_while_queued_never_runs(gate):
    thread = RedisThread()
    ran = []
    first = thread.submit(gate.wait)
    second = thread.submit(ran.append, 'second')
    assert second.cancel()
    gate.set()
    assert first.result(timeout=2) is True
    assert thread.submit(ran.append, 'third').result(timeout=2) is None
    assert ran == ['third']


def test_an_error_is_handed_to_the_caller_and_the_thread_keeps_going():
    thread = RedisThread()
    with pytest.raises(ZeroDivisionError):
        thread.submit(lambda: 1 / 0).result(timeout=2)
    assert thread.submit(sum, [1, 2]).result(timeout=2) == 3
    assert thread.thread.daemon
