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
