"""GET /readyz against real services: it fails when the broker stops and when a lane loses its last
consumer, within one probe interval, and recovers after; /healthz stays the cheap liveness probe."""
import time

import pytest
from urllib.parse import urlsplit

from common import connections
from devstack.redis_server import start_redis
from devstack.processes import stop_children
from tests.integration.workers.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]
PAUSED = {'api_heavy': {'cluster': 0, 'per_task': 2}, 'es2_knn': 0, 'reserve_single_row': 0}


def ready(client):
    response = client.get('/readyz')
    return response.status_code, response.json()['checks']


@pytest.fixture
def own_broker(settings, tmp_path):
    """A redis-server of the test's own as the broker the API checks, so the test can stop it."""
    child, url = start_redis(tmp_path / 'broker.log')
    settings.CELERY_BROKER_URL = url
    connections.forget()
    yield child, url
    stop_children([child])
    connections.forget()


def test_readyz_fails_while_the_broker_is_down_and_recovers_when_it_is_back(
        own_broker, lanes_redis, configure, client, tmp_path):
    configure(**PAUSED)  # every lane paused: no consumer is needed
    child, url = own_broker
    assert ready(client) == (200, {'database': 'ok', 'lanes': 'ok', 'broker': 'ok', 'consumers': 'ok'})

    stop_children([child])
    started = time.monotonic()
    status, checks = ready(client)
    assert (status, checks['broker']) == (503, 'ConnectionError')
    assert time.monotonic() - started < 3  # well inside one 15 s probe interval
    assert client.get('/readyz')['Retry-After'] == '5'  # a 503 says when to look again
    assert client.get('/healthz').status_code == 200  # liveness doesn't depend on the broker

    back, _ = start_redis(tmp_path / 'broker-again.log', port=urlsplit(url).port)
    try:
        assert ready(client)[0] == 200
    finally:
        stop_children([back])


def test_readyz_fails_when_a_lane_loses_its_last_consumer_and_recovers_with_a_new_one(
        broker, start_worker, configure, client, settings):
    settings.WORKERS_RECONCILE_SECONDS = 0.5  # the workers' (start_worker), so stale is 0.75 s here
    configure(es2_knn=1)  # es2_knn paused: interactive and api_heavy need a consumer
    status, checks = ready(client)
    assert status == 503 and checks['consumers'] == 'no consumer for interactive, api_heavy'

    worker = start_worker(name='all')
    wait_until(lambda: ready(client)[0] == 200, timeout=10, interval=0.1, message='ready with a consumer')
    worker.kill()  # SIGKILL: no clean goodbye, its last heartbeat just goes stale
    lost = time.monotonic()
    wait_until(lambda: ready(client)[0] == 503, timeout=5, interval=0.1, message='not ready')
    assert time.monotonic() - lost <= 0.75 + 0.6  # stale after 1.5 reconcile intervals
    # Each lane's heartbeat is written in turn within a tick, so the second can go stale a moment later.
    wait_until(lambda: ready(client)[1]['consumers'] == 'no consumer for interactive, api_heavy', timeout=1,
               interval=0.05, message='both lanes without a consumer')

    again = start_worker(name='again')
    wait_until(lambda: ready(client)[0] == 200, timeout=10, interval=0.1, message='ready again')
    again.stop()  # a clean stop leaves the registry at once
    assert ready(client)[0] == 503
