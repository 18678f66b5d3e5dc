"""Completion notices: a thread keeps its subscriber between waits and still hears only what it waits for."""
import threading
import time
import uuid

import pytest

from workers import notify

pytestmark = pytest.mark.redis


def later(seconds, function, *args):
    timer = threading.Timer(seconds, function, args)
    timer.start()
    return timer


def test_a_thread_reuses_its_subscriber_and_each_wait_hears_its_own_call():
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    done = set()

    def finish(call_id):
        done.add(call_id)
        notify.publish(call_id, 'succeeded')
    try:
        later(0.2, finish, first)
        started = time.monotonic()
        assert notify.wait_for(first, lambda: first in done, 5)
        assert time.monotonic() - started < 2  # woken by the notice, not by the timeout
        subscriber = notify.subscriber()
        # A notice for the first call arriving now must not end the second wait.
        notify.publish(first, 'succeeded')
        later(0.3, finish, second)
        started = time.monotonic()
        assert notify.wait_for(second, lambda: second in done, 5)
        assert 0.25 < time.monotonic() - started < 2
        assert notify.subscriber() is subscriber
        # A wait that times out says so.
        assert notify.wait_for(uuid.uuid4().hex, lambda: False, 0.2) is False
    finally:
        notify.forget_subscriber()
