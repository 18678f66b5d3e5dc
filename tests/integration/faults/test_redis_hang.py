"""A lanes Redis that hangs (its process stopped with SIGSTOP, then continued), with real workers.

The broker is a separate Redis here (db 14 of the shared one), as DESIGN.md allows; the second test makes
the broker hang too and shows the clear 503.
"""
import time

import pytest
import redis
from django.db import connection

from capacity.keys import RATE_LANE
from capacity.store import use_store
from common import connections
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS, submit
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
DEADLINE = 0.3
SKIP = 4


@pytest.fixture
def hanging_lanes(own_redis, settings, start_worker):
    """The limiter's lanes on `own_redis` (short deadline and skip window), set after the shared fixtures."""
    settings.REDIS_HOST, settings.REDIS_PORT, settings.REDIS_DB = '127.0.0.1', own_redis.port, 0
    settings.REDIS_URL = f'redis://127.0.0.1:{own_redis.port}/0'
    settings.CAPACITY_REDIS_DEADLINE_SECONDS = DEADLINE
    settings.CAPACITY_REDIS_RETRY_SECONDS = SKIP
    use_store(None)  # built from the settings above, with the production timeouts
    connections.forget()
    yield own_redis
    use_store(None)
    connections.forget()


def in_flight(port):
    client = redis.Redis(port=port, socket_timeout=2)
    try:
        now_ms = client.time()[0] * 1000
        return sum(client.zcount(key, now_ms, '+inf') for key in client.scan_iter(match='{*', count=1000)
                   if client.type(key) == b'zset' and f'}}:{RATE_LANE}:' not in key.decode())  # leases, not requests
    finally:
        client.close()


def test_a_hung_lanes_redis_costs_one_call_the_deadline_and_the_work_goes_on(
        hanging_lanes, start_worker, tiny_source, make_user, api_as, configure):
    configure(lease_seconds=15, renew_seconds=5)
    start_worker(concurrency=2, REDIS_URL=f'redis://127.0.0.1:{hanging_lanes.port}/0',
                 CAPACITY_REDIS_DEADLINE_SECONDS=DEADLINE, CAPACITY_REDIS_RETRY_SECONDS=SKIP)
    client = api_as(make_user('core_user'))
    running = submit(client, tiny_source, rows=LONG_ROWS, reranker=True, limit=100).json()['id']
    wait_until(lambda: Work.objects.filter(pk=running, state='running').exists(), timeout=30,
               interval=0.02, message='the long call to run')
    hanging_lanes.pause()
    try:
        timings, decisions, ids = [], [], []
        for _ in range(3):
            started = time.monotonic()
            response = submit(client, tiny_source)
            timings.append(time.monotonic() - started)
            decisions.append(response['X-OCL-Capacity-Decision'])
            assert response.status_code == 202
            ids.append(response.json()['id'])
        assert decisions == ['unavailable'] * 3
        assert DEADLINE <= timings[0] < DEADLINE + 1.0  # the first call waits out the deadline...
        assert max(timings[1:]) < DEADLINE  # ...the next ones skip Redis at once
        # The worker goes on running calls while the lanes are unreachable.
        for call_id in [running, *ids]:
            wait_until(lambda call_id=call_id: Work.objects.get(pk=call_id).state == 'succeeded', timeout=60,
                       interval=0.2, message=f'{call_id} to succeed during the hang')
    finally:
        hanging_lanes.resume()
    time.sleep(SKIP + 0.2)
    after = submit(client, tiny_source)
    assert after['X-OCL-Capacity-Decision'] == 'admitted'  # counting resumed
    wait_until(lambda: Work.objects.get(pk=after.json()['id']).state == 'succeeded', timeout=30,
               message='the call after the hang')
    # The releases met by the skip window were deferred: they are sent once the window has passed.
    wait_until(lambda: in_flight(hanging_lanes.port) == 0, timeout=20, interval=0.5, message='no lease left')


def test_a_hung_redis_that_is_also_the_broker_is_a_clear_503_with_nothing_half_submitted(
        hanging_lanes, tiny_source, make_user, api_as, monkeypatch):
    from celery import Celery

    from workers import lifecycle
    from workers.celery import app
    monkeypatch.delenv('CELERY_BROKER_URL')  # Celery lets this variable win over any configured URL
    same = Celery('same-redis', broker=f'redis://127.0.0.1:{hanging_lanes.port}/1', set_as_current=False)
    same.conf.update(task_publish_retry_policy=app.conf.task_publish_retry_policy,
                     broker_transport_options=app.conf.broker_transport_options)
    monkeypatch.setattr(lifecycle.create, 'send', lambda work, **options: same.send_task(
        'heavy_lanes.run_heavy_call', args=[work.pk], task_id=work.pk, queue=work.queue))
    user = make_user()
    hanging_lanes.pause()
    try:
        started = time.monotonic()
        response = submit(api_as(user), tiny_source)
        took = time.monotonic() - started
    finally:
        hanging_lanes.resume()
    assert response.status_code == 503 and response.json()['error_code'] == 'queue_unavailable'
    assert took < 10
    assert Work.objects.count() == 0
    assert in_flight(hanging_lanes.port) == 0
    connection.close()
