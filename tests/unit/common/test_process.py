"""Per-process state across fork(): gunicorn forks its workers and a lane worker forks pool processes
(pool_grow) while its own threads run. A lock another thread held at the fork is free in the child, and
a value made in the parent is made again in the child."""
import importlib
import os
import threading

import pytest

from common.process import ForkGuard, PerProcess

# Every module with process state keeps it in one PerProcess (or the fork guard).
PER_PROCESS = [
    ('capacity.store', '_stores'), ('capacity.logs', '_sinks'), ('capacity.counters', '_pending'),
    ('capacity.config', '_cache_lock'), ('common.connections', '_clients'),
    ('concepts.matching.store', '_cache_lock'), ('concepts.matching.store', '_build_locks'),
]


def in_child(check):
    """Run `check()` in a forked child; True when it returned truthy there."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_a_value_is_made_once_per_process_and_again_in_a_forked_child():
    made = []
    value = PerProcess(lambda: made.append(os.getpid()) or object())
    first = value.get()
    assert value.get() is first and made == [os.getpid()]
    assert in_child(lambda: value.get() is not first and value.get() is value.get())
    assert value.get() is first


def test_a_lock_held_by_another_thread_at_fork_is_free_in_the_child():
    value = PerProcess(object)
    held, release = threading.Event(), threading.Event()

    def hold():
        with value._lock:
            held.set()
            release.wait(10)
    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    try:
        assert in_child(lambda: value.get() is not None)  # get() takes the lock in the child
    finally:
        release.set()
        holder.join(5)


def test_set_peek_and_clear():
    value = PerProcess(lambda: 'made')
    assert value.peek() is None
    assert value.set('given') == 'given' and value.get() == 'given' and value.peek() == 'given'
    value.clear()
    assert value.get() == 'made'


def test_a_fork_waits_for_the_guard_and_the_child_gets_it_free():
    guard = ForkGuard()
    forked = threading.Event()

    def fork_now():
        assert in_child(lambda: guard._lock.acquire(timeout=2))
        forked.set()
    with guard:
        thread = threading.Thread(target=fork_now)
        thread.start()
        assert not forked.wait(0.3)  # the fork waits while the guard is held
    assert forked.wait(5)
    thread.join(5)


@pytest.mark.parametrize('module_name, attribute', PER_PROCESS)
def test_modules_keep_their_process_state_in_one_per_process_value(module_name, attribute):
    assert isinstance(getattr(importlib.import_module(module_name), attribute), PerProcess)
