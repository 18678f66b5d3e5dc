"""Lane workers fork new pool processes (pool_grow) while their reconciler thread runs; a module lock held
by that thread at the fork would be held forever in the child. Each module lock is fresh in a child."""
import os
import threading

import pytest

LOCKS = [('capacity.config', '_cache_lock'), ('capacity.logs', '_sink_lock'), ('workers.notify', '_lock'),
         ('workers.status', '_lock'), ('concepts.matching.store', '_cache_lock'),
         ('capacity.counters', '_pending_lock')]


@pytest.mark.parametrize('module_name, attribute', LOCKS)
def test_a_lock_held_by_another_thread_at_fork_is_free_in_the_child(module_name, attribute):
    import importlib
    module = importlib.import_module(module_name)
    held, release = threading.Event(), threading.Event()

    def hold():
        with getattr(module, attribute):
            held.set()
            release.wait(10)
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    try:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if the lock can be taken
            os._exit(0 if getattr(module, attribute).acquire(timeout=2) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        holder.join(5)
    assert os.waitstatus_to_exitcode(status) == 0
