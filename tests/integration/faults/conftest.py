"""Fault fixtures: a redis-server of the test's own (to SIGSTOP), with real workers and the API."""
import pytest

from tests.integration.capacity.conftest import own_redis  # noqa: F401  (shared fixtures)
from tests.integration.workers.conftest import (  # noqa: F401
    api_as, broker, celery_app, celery_worker_parameters, configure, in_process_worker, lanes_redis, start_worker,
    tiny_source,
)


@pytest.fixture
def fault_stack(own_redis, key_prefix, tmp_path, start_worker, transactional_db):  # noqa: F811 - fixtures
    from tests.integration.faults.stack import FaultStack
    stack = FaultStack(own_redis, key_prefix, tmp_path, start_worker)
    try:
        yield stack
    finally:
        stack.stop()
