"""Fixtures for gate tests: the lane store on each backend, a fresh config cache, captured log lines."""
import pytest

from capacity.config import clear_cache, save_config
from capacity.gate import CapacityGate
from capacity.store import RedisLanes


@pytest.fixture
def lanes(redis_client, db):
    """RedisLanes on this test's backend (fakeredis or the real Redis) with the default config."""
    RedisLanes.use_client(redis_client)
    clear_cache()
    yield redis_client
    RedisLanes.use_client(None)
    clear_cache()


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
    """acquire(user, ...) -> an acquired CapacityGate; every gate is released at teardown."""
    made = []

    def acquire(user, endpoint='$match', rows=10, semantic=True, reranker=False, metadata=None, **call):
        gate = CapacityGate(user, endpoint, rows=rows, semantic=semantic, reranker=reranker,
                            metadata=metadata, **call).acquire()
        made.append(gate)
        return gate
    yield acquire
    for gate in made:
        gate.release()
