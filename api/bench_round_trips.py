"""Benchmark-only: count every Redis round trip a process makes, for bench/cost.py.

Installed only by api/bench_views.py, and only when HEAVY_LANES_BENCH_ROUND_TRIPS_DIR names a directory
(bench/cost.py's stack sets it; production never imports api.bench_views): the service's own code never
imports this module, so with the setting off it costs nothing and nothing on the request path changes.

What counts as one round trip: one `send_packed_command` of a redis-py connection, which is one write of
one or more commands that the caller then reads the answers of: a command, a whole pipeline or MULTI/EXEC
block, a script call (EVALSHA; its NOSCRIPT fallback to EVAL is a second one), a pub/sub SUBSCRIBE, a
health-check PING, the HELLO of a new connection. Every redis-py connection of the process is counted:
the lane store's, the cache's, the notice subscriber's and kombu's broker connections (the publishing
client and the consumer's BRPOP alike: kombu's Redis transport is redis-py).

Each process keeps its count in an 8-byte file of its own, `<process group>-<pid>` in the directory, mapped
into memory (a count survives the process that wrote it and is read without asking the process anything);
a forked child (a prefork pool process, a gunicorn worker) starts a file of its own.
"""
import mmap
import os
import struct
import threading

import redis.connection

_COUNT = struct.Struct('<Q')
_state = {'directory': None, 'counter': None}


class Counter:
    """This process's round trips, written through to its file at every count."""

    def __init__(self, directory):
        self.path = os.path.join(directory, f'{os.getpgid(0)}-{os.getpid()}')
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(descriptor, _COUNT.size)
            self.map = mmap.mmap(descriptor, _COUNT.size)
        finally:
            os.close(descriptor)
        self.count = 0
        # The API's threads share one counter: the increment and the write are one step, or two threads could
        # leave the smaller of their counts in the file.
        self.lock = threading.Lock()

    def add(self):
        with self.lock:
            self.count += 1
            _COUNT.pack_into(self.map, 0, self.count)


def read(directory):
    """{file name (`<process group>-<pid>`): round trips} of every process that counted into `directory`."""
    counts = {}
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), 'rb') as handle:
            data = handle.read(_COUNT.size)
        if len(data) == _COUNT.size:
            counts[name] = _COUNT.unpack(data)[0]
    return counts


def _new_counter():
    _state['counter'] = Counter(_state['directory'])


def install(directory):
    """Count this process's round trips (and its forked children's) into `directory`. Idempotent."""
    if _state['directory'] is not None:
        return
    _state['directory'] = directory
    _new_counter()
    os.register_at_fork(after_in_child=_new_counter)
    send = redis.connection.AbstractConnection.send_packed_command

    def counted_send(self, command, check_health=True):
        _state['counter'].add()
        return send(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted_send
