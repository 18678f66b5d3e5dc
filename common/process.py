"""Per-process state that survives `fork()`: the one helper every module with process state uses.

gunicorn forks its workers from a master that may have loaded the app, and a Celery prefork worker forks
its pool processes (again on every `pool_grow`) while its own threads run. A forked child inherits the
parent's objects but not its threads, so two things go wrong with hand-rolled module state:
- a lock that another thread of the parent held at the fork stays held in the child forever;
- a client, a daemon thread or a queue made in the parent belongs to the parent (its thread is gone).

`PerProcess(make)` holds one value per process: made by `make()` on first use and made again, lazily, in
a child after a fork (`get()` compares the pid). Every instance gets a fresh lock in a child.
`ForkGuard` is the other half: a lock that forks wait for, for code that must not be mid-way through a
library call (holding that library's locks) at the moment its process forks.

Written by hand because the standard library has only the raw hook (`os.register_at_fork`) and nothing
that pairs it with lazy, thread-safe per-process construction.
"""
import os
import threading
import weakref

_instances = weakref.WeakSet()


class PerProcess:
    """One value per process, made by `make()` on first use in each process."""

    def __init__(self, make):
        self._make = make
        self._state = (None, None)  # (pid, value), replaced as a whole so get() reads it without the lock
        self._lock = threading.Lock()
        _instances.add(self)

    def get(self):
        pid, value = self._state
        if pid == os.getpid():
            return value
        with self._lock:
            pid, value = self._state
            if pid != os.getpid():
                value = self._make()
                self._state = (os.getpid(), value)
            return value

    def set(self, value):
        """Use `value` in this process from now on (tests inject their own instance)."""
        with self._lock:
            self._state = (os.getpid(), value)
        return value

    def peek(self):
        """This process's value if it was made, else None (never makes one)."""
        pid, value = self._state
        return value if pid == os.getpid() else None

    def clear(self):
        """Forget this process's value: the next get() makes a new one."""
        with self._lock:
            self._state = (None, None)

    def _after_fork_in_child(self):
        self._lock = threading.Lock()


class ForkGuard:
    """A lock that every fork of this process waits for: hold it around work that must not be forked."""

    def __init__(self):
        self._lock = threading.Lock()
        os.register_at_fork(before=self._before, after_in_parent=self._after_in_parent,
                            after_in_child=self._after_in_child)

    def _before(self):
        self._lock.acquire()

    def _after_in_parent(self):
        self._lock.release()

    def _after_in_child(self):
        self._lock = threading.Lock()

    def __enter__(self):
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()


def _after_fork_in_child():
    for instance in list(_instances):
        instance._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
