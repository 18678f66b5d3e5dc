"""Fixtures of the limiter's tests: the lane store on each backend (`store`, and `lanes` with a fresh config
cache for the gate), captured config log lines, admissions released at teardown, and Redis servers of a
test's own to stop (SIGSTOP), hang or point the store at.

Every process or thread a fixture starts is stopped by its own pid or handle in teardown, also when the test
failed.
"""
import contextlib
import os
import signal
import socket
import threading

import pytest

from capacity import gate
from capacity.caller import RequestFacts, is_aware
from capacity.config import clear_cache, save_config
from capacity.store import LaneStore, use_store
from devstack import redis_server
from devstack.processes import free_port
from tests.conftest import missing_service


@pytest.fixture(autouse=True)
def config_lines(monkeypatch):
    """The ocl_capacity_config lines, captured instead of written; a cold cache before and after."""
    lines = []
    monkeypatch.setattr('capacity.config.emit', lines.append)
    clear_cache()
    yield lines
    clear_cache()


@pytest.fixture
def configure(config_lines):
    def configure(**changes):
        save_config(changes)
    return configure


@pytest.fixture
def gates():
    """acquire(user, ...) -> the Admission of one call; every admission's leases are released at teardown.

    `queue` names a queue of workers.lanes (its lane is the one its waiting room extends); `metadata` is the
    X-OCL-Event-Metadata object.
    """
    from workers.lanes import get_queue
    made = []

    def acquire(user, endpoint='$match', rows=10, semantic=True, reranker=False, metadata=None, queue='', **call):
        facts = call.pop('facts', None) or RequestFacts(aware=is_aware(metadata or {}))
        draws_on = get_queue(queue).draws_on if queue else None
        admission = gate.admit(user, endpoint=endpoint, rows=rows, semantic=semantic, reranker=reranker,
                               queue=queue, draws_on=draws_on, facts=facts, **call)
        made.append(admission)
        return admission
    yield acquire
    for admission in made:
        gate.release(admission)


@pytest.fixture
def store(redis_client):
    """The operations of a LaneStore on this test's backend (fakeredis or the real Redis; `redis_client`
    deletes the keys): the raising layer under the store's verbs (capacity.operations)."""
    made = use_store(LaneStore(redis_client))
    yield made.ops
    use_store(None)


class RedisServer:
    """A redis-server of this test's own (devstack.redis_server), to stop (SIGSTOP) and kill by its pid."""

    def __init__(self, log_path, port=None):
        self.log_path = log_path
        self.port = port or free_port()
        self.child = None

    def start(self):
        if redis_server.server_binary() is None:
            missing_service('no redis-server binary (apt-get install -y redis-server)')
        try:
            self.child, _ = redis_server.start_redis(self.log_path, port=self.port,
                                                     data_dir=self.log_path.parent, timeout=5)
        except redis_server.RedisStartError as ex:
            pytest.fail(str(ex))
        return self

    def pause(self):
        os.kill(self.child.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.child.pid, signal.SIGCONT)

    def stop(self):
        """SIGTERM by its process group, SIGKILL after 5 s."""
        if self.child is None or not self.child.running():
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.child.pid, signal.SIGCONT)  # a stopped process can't act on SIGTERM
        self.child.stop(5)


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / 'own-redis.log').start()
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
        store.runner.client.close()
