"""Fault fixtures: a redis-server of the test's own (to SIGSTOP), with real workers and the API."""
import pytest

from tests.integration.capacity_store.conftest import RedisServer
from tests.integration.workers.conftest import (  # noqa: F401  (shared fixtures)
    api_as, broker, configure, lanes_redis, start_worker, tiny_source,
)


@pytest.fixture
def own_redis():
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
