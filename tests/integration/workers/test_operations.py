"""Operations against real workers: queue depth and age in status and metrics, resizing through the
config endpoint, a Flower resize becoming the lane's limit, and a metrics scrape that agrees with status."""
import base64
import os
import re
import time
import urllib.request

import pytest

from devstack.processes import Child, free_port
from devstack.services import flower_argv
from tests.integration.workers.conftest import ROOT, wait_until
from tests.integration.workers.test_queue import pool_of, read_whole, submit

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def scrape(client):
    text = client.get('/metrics').content.decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith('#'):
            name, value = line.rsplit(' ', 1)
            samples[name] = float(value)
    return samples


def test_a_stopped_lanes_queue_shows_its_depth_and_age_until_a_worker_drains_it(
        broker, start_worker, tiny_source, make_user, api_as, client):
    staff = api_as(make_user(is_staff=True))
    user = api_as(make_user('core_user'))
    ids = [submit(user, tiny_source).json()['id'] for _ in range(5)]
    first = staff.get('/capacity/status/').json()['queues']['es2_knn']
    assert first['depth'] == 5 and first['consumers'] == 0 and first['drift'] is None
    time.sleep(1.1)
    second = staff.get('/capacity/status/').json()['queues']['es2_knn']
    assert second['oldest_waiting_seconds'] > first['oldest_waiting_seconds'] >= 0
    metrics = scrape(client)
    assert metrics['heavy_lanes_queue_depth{queue="es2_knn"}'] == 5
    assert metrics['heavy_lanes_queue_oldest_waiting_seconds{queue="es2_knn"}'] >= second['oldest_waiting_seconds']
    assert metrics['heavy_lanes_calls_open{queue="es2_knn",state="queued"}'] == 5

    start_worker(queues=('es2_knn',))
    wait_until(lambda: all(user.get(f'/tasks/{i}/').json()['state'] == 'succeeded' for i in ids), timeout=60,
               interval=0.2, message='the queue to drain')
    drained = staff.get('/capacity/status/').json()['queues']['es2_knn']
    assert drained['depth'] == 0 and drained['oldest_waiting_seconds'] == 0
    metrics = scrape(client)
    assert metrics['heavy_lanes_queue_depth{queue="es2_knn"}'] == 0
    assert metrics['heavy_lanes_calls_finished_total{queue="es2_knn",state="succeeded"}'] == 5
    # es2_knn's bulk limit is 2: two calls were admitted, three queued as shadow-refused.
    assert metrics['heavy_lanes_decisions_total{decision="admitted",queue="es2_knn",tier="core"}'] == 2
    assert metrics['heavy_lanes_decisions_total{decision="shadow-refused",queue="es2_knn",tier="core"}'] == 3


def test_patching_a_lane_limit_resizes_a_running_pool_and_is_in_the_history(
        broker, start_worker, make_user, api_as):
    worker = start_worker(name='knn', queues=('es2_knn',), concurrency=2)
    admin = make_user(is_staff=True, username='ops-alice')
    staff = api_as(admin)
    wait_until(lambda: pool_of(worker.node) == 2, timeout=10, interval=0.3, message='pool 2 (default 3 - 1)')
    started = time.monotonic()
    assert staff.patch('/capacity/config/', {'es2_knn': 1, 'note': 'pause knn'}, format='json').status_code == 200
    wait_until(lambda: staff.get('/capacity/status/').json()['queues']['es2_knn']['consumers'] == 0,
               timeout=5, interval=0.2, message='the lane to pause')
    assert staff.patch('/capacity/config/', {'es2_knn': 3, 'note': 'resume'}, format='json').status_code == 200
    wait_until(lambda: staff.get('/capacity/status/').json()['queues']['es2_knn']['pool'] == 2,
               timeout=5, interval=0.2, message='the lane to resume with 2')
    assert time.monotonic() - started < 10
    history = staff.get('/capacity/config/history/').json()
    assert [(h['created_by'], h['note'], h['changes']) for h in history[:2]] == [
        ('ops-alice', 'resume', {'es2_knn': [1, 3]}), ('ops-alice', 'pause knn', {'es2_knn': [3, 1]})]


@pytest.fixture
def flower(start_worker, tmp_path):
    port = free_port()
    env = {**os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings'}
    child = Child('flower', [*flower_argv(port), '--basic_auth=ops:secret'], tmp_path / 'flower.log',
                  cwd=ROOT).start(env)
    url = f'http://127.0.0.1:{port}'
    try:
        wait_until(lambda: _answers(url), timeout=30, interval=0.2, message='Flower to answer')
        yield url
    finally:
        child.stop(10)  # SIGTERM to its process group, SIGKILL after 10 s


def _answers(url):
    try:
        urllib.request.urlopen(url + '/healthcheck', timeout=1)
        return True
    except OSError:
        return False


def flower_knows(url, node, auth='ops:secret'):
    request = urllib.request.Request(url + '/api/workers?refresh=1')
    request.add_header('Authorization', 'Basic ' + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return node in response.read().decode()
    except OSError:
        return False


def flower_post(url, path, auth='ops:secret'):
    request = urllib.request.Request(url + path, method='POST', data=b'')
    if auth:
        request.add_header('Authorization', 'Basic ' + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as ex:
        return ex.code


def pools(staff, queue):
    """{node: pool processes} of the live nodes serving `queue`, as /capacity/status/ shows them."""
    workers = staff.get('/capacity/status/').json()['queues'][queue]['workers']
    return {node: entry['processes'] for node, entry in workers.items()}


def flower_entries(staff):
    return [entry for entry in staff.get('/capacity/config/history/').json() if entry['source'] == 'flower']


def test_a_flower_pool_grow_becomes_the_lane_limit_and_both_nodes_resplit_it(
        broker, start_worker, flower, make_user, api_as):
    a = start_worker(name='knn-a', queues=('es2_knn',))
    b = start_worker(name='knn-b', queues=('es2_knn',))
    staff = api_as(make_user(is_staff=True))
    wait_until(lambda: pools(staff, 'es2_knn') == {a.node: 1, b.node: 1}, timeout=10, interval=0.2,
               message='pool 2 (es2_knn 3 - 1) split 1 + 1')
    # The reconcilers' own resizes, after a config change, are never taken for hand resizes.
    changed = staff.patch('/capacity/config/', {'es2_knn': 5, 'note': 'more kNN'}, format='json')
    assert changed.status_code == 200
    wait_until(lambda: pools(staff, 'es2_knn') == {a.node: 2, b.node: 2}, timeout=10, interval=0.2,
               message='pool 4 split 2 + 2')
    time.sleep(1.5)  # three reconcile intervals
    assert flower_entries(staff) == []
    wait_until(lambda: flower_knows(flower, b.node), timeout=20, interval=0.5, message='Flower to see it')

    assert flower_post(flower, f'/api/worker/pool/grow/{b.node}?n=1') == 200
    grown = time.monotonic()
    wait_until(lambda: staff.get('/capacity/config/').json()['config']['es2_knn'] == 6, timeout=5,
               interval=0.05, message='the lane limit to follow')
    assert time.monotonic() - grown < 1.0  # one reconcile interval (0.5 s) and the save
    [entry] = flower_entries(staff)
    assert entry['changes'] == {'es2_knn': [5, 6]} and entry['created_by'] is None
    assert f'{b.node} pool grown by hand from 2 to 3 processes' in entry['note']
    # Both nodes re-split the new pool size, 6 - 1 = 5 (the first by name takes the odd one).
    wait_until(lambda: pools(staff, 'es2_knn') == {a.node: 3, b.node: 2}, timeout=10, interval=0.2,
               message='pool 5 split 3 + 2')
    time.sleep(1.5)
    assert pools(staff, 'es2_knn') == {a.node: 3, b.node: 2}
    assert len(flower_entries(staff)) == 1  # one resize, one config change


def test_a_call_sends_no_task_event_while_flower_watches_the_workers(
        broker, start_worker, flower, tiny_source, make_user, api_as):
    """Task events cost each call Redis PUBLISHes and its node's main process CPU for Flower's task views
    alone: none is sent, even with Flower watching (it would turn them on), while the worker events Flower's
    worker views and pool resize live on still are."""
    worker = start_worker(queues=('interactive',))
    wait_until(lambda: flower_knows(flower, worker.node), timeout=20, interval=0.5, message='Flower to see it')
    events = broker.pubsub()
    events.psubscribe('*celeryev*')
    user = api_as(make_user('core_user'))
    call_id = submit(user, tiny_source, rows=[{'name': 'fever'}]).json()['id']
    wait_until(lambda: read_whole(user.get(f'/tasks/{call_id}/')).json()['state'] == 'succeeded', timeout=30,
               interval=0.1, message='the call to run')
    channels = []

    def heard_a_heartbeat():
        while (message := events.get_message(timeout=0.1)) is not None:
            if message['type'] == 'pmessage':
                channels.append(message['channel'].decode())
        return any('worker.heartbeat' in channel for channel in channels)
    wait_until(heard_a_heartbeat, timeout=10, interval=0.1, message='a worker heartbeat')
    events.close()
    assert [channel for channel in channels if '.task.' in channel or channel.endswith('task.received')] == []


def test_a_flower_pool_shrink_lowers_the_lane_limit(broker, start_worker, flower, make_user, api_as):
    worker = start_worker(name='heavy', queues=('api_heavy',), concurrency=1)
    staff = api_as(make_user(is_staff=True))
    wait_until(lambda: pools(staff, 'api_heavy') == {worker.node: 3}, timeout=10, interval=0.2,
               message='pool 3 (cluster 4 - 1)')
    wait_until(lambda: flower_knows(flower, worker.node), timeout=20, interval=0.5, message='Flower to see it')
    assert flower_post(flower, f'/api/worker/pool/shrink/{worker.node}?n=1', auth=None) == 401
    assert flower_post(flower, f'/api/worker/pool/shrink/{worker.node}?n=1') == 200
    wait_until(lambda: staff.get('/capacity/config/').json()['config']['api_heavy'] == {
        'cluster': 3, 'per_task': 64}, timeout=5, interval=0.1, message='the cluster limit to follow')
    assert [entry['changes'] for entry in flower_entries(staff)] == [{'api_heavy.cluster': [4, 3]}]
    queue = staff.get('/capacity/status/').json()['queues']['api_heavy']
    assert (queue['pool'], queue['configured_pool'], queue['drift']) == (2, 2, 0)


def test_a_scrape_while_calls_run_has_every_series_and_agrees_with_status(
        broker, start_worker, tiny_source, make_user, api_as, client, configure):
    from tests.integration.workers.test_queue import LONG_ROWS
    configure(mode='shadow', per_user={'staff': 1, 'core': 1, 'early_access': 1, 'preview': 1})
    start_worker(queues=('es2_knn',), concurrency=2)
    user = api_as(make_user('core_user'))
    ids = [submit(user, tiny_source, rows=LONG_ROWS, reranker=True, limit=100).json()['id'] for _ in range(3)]
    wait_until(lambda: any(user.get(f'/tasks/{i}/').json()['state'] == 'running' for i in ids), timeout=20,
               interval=0.05, message='a call to run')
    status = api_as(make_user(is_staff=True)).get('/capacity/status/').json()
    metrics = scrape(client)
    names = {re.sub(r'\{.*', '', name) for name in metrics}
    assert {
        'heavy_lanes_redis_up', 'heavy_lanes_mode', 'heavy_lanes_lane_in_flight', 'heavy_lanes_lane_limit',
        'heavy_lanes_queue_depth', 'heavy_lanes_queue_oldest_waiting_seconds', 'heavy_lanes_queue_consumers',
        'heavy_lanes_queue_pool_processes', 'heavy_lanes_queue_pool_configured', 'heavy_lanes_decisions_total',
        'heavy_lanes_full_lanes_total', 'heavy_lanes_lease_renewals_failed_total',
        'heavy_lanes_leases_expired_total', 'heavy_lanes_calls_open',
    } <= names
    assert metrics['heavy_lanes_lane_in_flight{lane="es2_knn"}'] == status['es2_knn']['in_flight'] == 3
    assert metrics['heavy_lanes_lane_limit{kind="bulk",lane="es2_knn"}'] == status['es2_knn']['bulk_limit']
    assert metrics['heavy_lanes_queue_pool_processes{queue="es2_knn"}'] == status['queues']['es2_knn']['pool']
    assert metrics['heavy_lanes_decisions_total{decision="shadow-refused",queue="es2_knn",tier="core"}'] == 2
    assert metrics['heavy_lanes_full_lanes_total{decision="shadow-refused",lane="user",tier="core"}'] == 2
    assert metrics['heavy_lanes_redis_up'] == 1
    for call_id in ids:
        wait_until(lambda call_id=call_id: read_whole(user.get(f'/tasks/{call_id}/')).json()['state'] == 'succeeded',
                   timeout=60, interval=0.2, message='calls to finish')
    # A call's end is counted by its worker's Redis thread a moment after its row says so (capacity.counters):
    # a pool process at a lower CPU priority (WORKERS_BULK_NICENESS) was once still sending the third.
    finished = 'heavy_lanes_calls_finished_total{queue="es2_knn",state="succeeded"}'
    wait_until(lambda: scrape(client).get(finished) == 3, timeout=10, interval=0.2, message='the ends counted')
    assert scrape(client)['heavy_lanes_lane_in_flight{lane="es2_knn"}'] == 0


def test_a_flower_grow_racing_a_patch_ends_at_the_patchs_limit(broker, start_worker, flower, make_user, api_as):
    """Flower grows the node 2 -> 3 (es2_knn 3 -> 4) and a PATCH sets es2_knn 5 before the reconciler saw
    the grow: the limit ends at 5, what was asked last, and the pool at its 4. Before, the node added its
    +1 to the PATCH's 5: 6, a number nobody asked for."""
    worker = start_worker(name='knn', queues=('es2_knn',))
    staff = api_as(make_user(is_staff=True))
    wait_until(lambda: pools(staff, 'es2_knn') == {worker.node: 2}, timeout=10, interval=0.2,
               message='pool 2 (es2_knn 3 - 1)')
    wait_until(lambda: flower_knows(flower, worker.node), timeout=20, interval=0.5, message='Flower to see it')

    assert flower_post(flower, f'/api/worker/pool/grow/{worker.node}?n=1') == 200
    assert staff.patch('/capacity/config/', {'es2_knn': 5, 'note': 'more kNN'}, format='json').status_code == 200

    wait_until(lambda: pools(staff, 'es2_knn') == {worker.node: 4}, timeout=10, interval=0.2,
               message='pool 4 (es2_knn 5 - 1)')
    time.sleep(2)  # four reconcile intervals: nothing more is adopted
    assert staff.get('/capacity/config/').json()['config']['es2_knn'] == 5
    assert pools(staff, 'es2_knn') == {worker.node: 4}
    newest = staff.get('/capacity/config/history/').json()[0]
    assert newest['source'] == 'api' and newest['changes']['es2_knn'][1] == 5
