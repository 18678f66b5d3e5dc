"""GET /readyz against real services: it fails when the broker stops or the database takes no writes, within
one probe interval, and recovers after; a lane that loses its last consumer is said beside the checks and
never fails a host's readiness; /healthz stays the cheap liveness probe."""
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


def consumers(client):
    return client.get('/readyz').json()['cluster']['consumers']


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
    assert ready(client) == (200, {'database': 'ok', 'lanes': 'ok', 'broker': 'ok'})

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


class BrokenPipe:
    """A pooled connection's socket whose peer is gone without it knowing: reads find nothing waiting (so
    the pool's checkout hands it out), the first write fails with EPIPE, as the cluster's API host saw after
    its link came back."""

    def __init__(self, sock):
        self.sock = sock

    def sendall(self, data):
        raise BrokenPipeError(32, 'Broken pipe')

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_a_pooled_broker_connection_that_lost_its_peer_doesnt_fail_readiness(
        own_broker, lanes_redis, configure, client):
    configure(**PAUSED)
    assert ready(client)[0] == 200
    pool = connections.connect('status', own_broker[1]).connection_pool
    idle = list(pool._available_connections)
    assert idle and all(conn._sock is not None for conn in idle)
    for conn in idle:
        conn._sock = BrokenPipe(conn._sock)
    assert ready(client) == (200, {'database': 'ok', 'lanes': 'ok', 'broker': 'ok'})


def test_a_lane_without_a_consumer_is_said_and_never_fails_the_hosts_readiness(
        broker, start_worker, configure, client, settings):
    settings.WORKERS_RECONCILE_SECONDS = 0.5  # the workers' (start_worker), so stale is 0.75 s here
    configure(es2_knn=1)  # es2_knn paused: interactive and api_heavy need a consumer
    assert ready(client)[0] == 200  # every host would say it at once: a cluster alert, not a host's fitness
    assert consumers(client) == 'no consumer for interactive, api_heavy'

    worker = start_worker(name='all')
    wait_until(lambda: consumers(client) == 'ok', timeout=10, interval=0.1, message='a consumer')
    worker.kill()  # SIGKILL: no clean goodbye, its last heartbeat just goes stale
    lost = time.monotonic()
    wait_until(lambda: consumers(client) != 'ok', timeout=5, interval=0.1, message='no consumer')
    assert time.monotonic() - lost <= 0.75 + 0.6  # stale after 1.5 reconcile intervals
    # Each lane's heartbeat is written in turn within a tick, so the second can go stale a moment later.
    wait_until(lambda: consumers(client) == 'no consumer for interactive, api_heavy', timeout=1,
               interval=0.05, message='both lanes without a consumer')
    assert ready(client)[0] == 200

    again = start_worker(name='again')
    wait_until(lambda: consumers(client) == 'ok', timeout=10, interval=0.1, message='a consumer again')
    again.stop()  # a clean stop leaves the registry at once
    assert consumers(client) != 'ok' and ready(client)[0] == 200


def readyz_fails_while_the_database_takes_no_writes(client, configure):
    """A read-only database (a full disk, a read-only role, a standby after a failover) answers SELECT 1
    and refuses every call: the host is not ready for heavy calls, which are rows before messages."""
    from django.db import connection
    switch = {'sqlite': ('PRAGMA query_only = ON', 'PRAGMA query_only = OFF'),
              'postgresql': ('SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY',
                             'SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE')}[connection.vendor]
    configure(**PAUSED)
    assert ready(client)[0] == 200
    with connection.cursor() as cursor:
        cursor.execute(switch[0])
    try:
        status, checks = ready(client)
        assert (status, checks['database']) == (503, 'ReadOnly')
    finally:
        with connection.cursor() as cursor:
            cursor.execute(switch[1])
    assert ready(client)[0] == 200


@pytest.mark.django_db(transaction=True)
def test_readyz_fails_while_the_database_takes_no_writes(lanes_redis, broker, configure, client):
    readyz_fails_while_the_database_takes_no_writes(client, configure)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_readyz_fails_while_the_database_takes_no_writes_on_postgres(lanes_redis, broker, configure, client):
    from django.db import connection

    from tests.conftest import missing_service
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    readyz_fails_while_the_database_takes_no_writes(client, configure)
