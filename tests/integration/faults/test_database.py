"""A worker whose database refuses writes never acknowledges a call it couldn't record: the call stays
queued (not lost, not `running` on nobody) and runs once a worker can write again."""
import time

import pytest

from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import submit
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_a_worker_that_cant_record_a_call_leaves_it_queued_for_one_that_can(
        start_worker, tiny_source, make_user, api_as, lanes_redis):
    client = api_as(make_user())
    read_only = start_worker(name='read-only', HEAVY_LANES_TEST_READ_ONLY_DB='1')
    call_id = submit(client, tiny_source).json()['id']
    wait_until(lambda: 'readonly database' in read_only.output(), timeout=20, message='the refused write')
    time.sleep(2)  # a few of its retries
    call = Work.objects.get(pk=call_id)
    assert (call.state, call.attempts) == ('queued', 0)
    read_only.stop()  # its retry message is given back to the broker
    start_worker(name='writable')
    task = wait_until(lambda: (lambda body: body if body['state'] == 'succeeded' else None)(
        client.get(f'/tasks/{call_id}/').json()), timeout=60, message='the call to run')
    assert task['result'][0]['results']
    assert Work.objects.get(pk=call_id).attempts == 1


@pytest.mark.postgres
def test_the_api_loses_no_request_when_every_database_connection_it_pooled_was_ended(
        fault_stack, tiny_source, make_user):
    """A PostgreSQL restart (or failover, or an administrator) ends every connection the API's pool holds. The
    pool checks a connection before it lends it (CONN_HEALTH_CHECKS), so each dead one costs a round trip,
    not a request: before, each failed one request with a 503."""
    import requests
    from django.db import connection

    from tests.conftest import missing_service
    if connection.vendor != 'postgresql':
        missing_service('the postgres tests need HEAVY_LANES_TEST_ON_POSTGRES=1 (PostgreSQL as the database)')
    url = fault_stack.api('api-a', threads=8, DATABASE_POOL_SIZE=4)
    token = make_user().auth_token.key

    def sources():
        return requests.get(f'{url}/sources/', headers={'Authorization': f'Token {token}'}, timeout=30).status_code
    # Fill the pool: requests from 8 threads at once borrow 4 connections.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda _: sources(), range(32))) == {200}
    with connection.cursor() as cursor:
        cursor.execute('SELECT pg_terminate_backend(pid) FROM pg_stat_activity '
                       'WHERE datname = current_database() AND pid <> pg_backend_pid()')
        ended = cursor.rowcount
    assert ended >= 1
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: sources(), range(32)))
    assert statuses == [200] * 32
