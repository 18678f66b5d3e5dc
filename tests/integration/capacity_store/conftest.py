"""Fixtures for the lane store: the store on each backend, a redis-server of our own, a server that hangs.

Every process or thread a fixture starts is stopped by its own pid or handle in teardown, also when the test
failed.
"""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
import redis

from capacity.store import LaneStore, use_store
from tests.conftest import missing_service


@pytest.fixture
def lanes(redis_client):
    """A LaneStore on this test's backend (fakeredis or the real Redis; `redis_client` deletes the keys)."""
    store = use_store(LaneStore(redis_client))
    yield store
    use_store(None)


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server subprocess of this test's own, so it can be stopped (SIGSTOP) and killed."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.process = None

    def start(self):
        binary = shutil.which('redis-server')
        if binary is None:
            missing_service('no redis-server binary (apt-get install -y redis-server)')
        self.process = subprocess.Popen(
            [binary, '--port', str(self.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            deadline = time.monotonic() + 5
            while True:
                try:
                    probe.ping()
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        self.stop()
                        pytest.fail(f'redis-server on port {self.port} did not start')
                    time.sleep(0.02)
        finally:
            probe.close()

    def pause(self):
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGCONT)  # a stopped process can't act on SIGTERM
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


@pytest.fixture
def own_redis():
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


class SilentServer:
    """A TCP server that accepts connections and never answers: a Redis hung after the handshake."""

    def __init__(self):
        self.listener = socket.create_server(('127.0.0.1', 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.connections = []
        self.accepted = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name='silent-server', daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            self.connections.append(connection)  # held open, never read, never answered
            self.accepted.set()

    def stop(self):
        self.stopping.set()
        self.thread.join(2)
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def lanes_at(settings):
    """lanes_at(port, sentinels=False): a LaneStore with a client built by build_redis_client() for `port`."""
    from capacity.store import build_redis_client

    def point(port, sentinels=False):
        settings.REDIS_HOST, settings.REDIS_PORT, settings.REDIS_DB, settings.REDIS_PASSWORD = (
            '127.0.0.1', port, 0, None)
        settings.REDIS_SENTINELS = sentinels
        settings.REDIS_SENTINELS_LIST = [('127.0.0.1', port)]
        settings.REDIS_SENTINELS_MASTER = 'primary'
        client = build_redis_client()
        made.append(use_store(LaneStore(client)))
        return client

    made = []
    yield point
    use_store(None)
    for store in made:
        store.client.close()
