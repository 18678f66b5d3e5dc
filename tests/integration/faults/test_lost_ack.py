"""An acknowledgement lost in a Redis stall must not cost the worker a prefetch slot: after the stall, a
lane with a pool of two still runs two calls at once (kombu's Redis QoS used to keep the unacked
message's slot forever, so the lane ran one call at a time until a restart)."""
import time

import pytest
import requests

from tests.integration.calls import distinct
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def long_call(url, token, source):
    response = requests.post(f'{url}/concepts/$match/?semantic=true&reranker=true', json={
        'rows': distinct(LONG_ROWS), 'target_repo_url': source, 'limit': 100},
        headers={'Authorization': f'Token {token}', 'Prefer': 'respond-async'}, timeout=30)
    assert response.status_code == 202, response.content
    return response.json()['id']


def pool_of(stack, node):
    """The node's pool processes, as its reconciler last published them."""
    return stack.status()['queues']['es2_knn']['workers'].get(node, {}).get('processes')


def running_at_once(ids):
    return Work.objects.filter(pk__in=ids, state='running').count()


def test_an_ack_lost_in_a_stall_keeps_the_pool_running_two_calls_at_once(
        fault_stack, tiny_source, make_user, configure):
    configure(es2_knn=3, per_user={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9})  # es2_knn pool: 2
    url = fault_stack.api()
    worker = fault_stack.worker(name='knn', queues=('es2_knn',), concurrency=1)
    # kombu's worker loop refreshes its binding tables in Redis a second after it starts, in the loop's own
    # thread: a stall begun before that blocks the loop in the refresh's connect until Redis is back, so
    # the acknowledgement is never tried during the stall and never lost. Stall after it.
    broker = fault_stack.broker()
    key = wait_until(lambda: next(broker.scan_iter('*_kombu.binding_deadlines'), None), timeout=20,
                     message="the worker's binding deadlines")
    declared = broker.zrange(key, 0, -1, withscores=True)
    wait_until(lambda: broker.zrange(key, 0, -1, withscores=True) != declared, timeout=20, interval=0.1,
               message="the worker's first binding refresh")
    token = make_user('core_user').auth_token.key
    first = long_call(url, token, tiny_source)
    wait_until(lambda: Work.objects.filter(pk=first, state='running').exists(), timeout=60,
               message='the first call to run')
    fault_stack.redis_server.pause()
    try:
        wait_until(lambda: Work.objects.get(pk=first).finished, timeout=60, message='the call to end')
        # Its acknowledgement fails at the broker's socket timeout (2 s) while Redis is stopped.
        wait_until(lambda: 'acknowledgement failed' in worker.output() or "Couldn't ack" in worker.output(),
                   timeout=20, message='the lost ack')
    finally:
        fault_stack.redis_server.resume()
    # The pool is two processes again (a stall slows the worker's main loop; it may restart one) ...
    wait_until(lambda: pool_of(fault_stack, worker.node) == 2, timeout=30, interval=0.5, message='a pool of two')
    # ... and both run: no prefetch slot was lost with the acknowledgement.
    ids = [long_call(url, token, tiny_source) for _ in range(2)]
    peak = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(Work.objects.get(pk=i).finished for i in ids):
        peak = max(peak, running_at_once(ids))
        time.sleep(0.02)
    assert peak == 2, worker.output()[-3000:]
    # The worker says it lost an ack, and settles it with a later one (its reconciler publishes that on its
    # next tick).
    def node():
        return fault_stack.status()['queues']['es2_knn']['workers']['knn@heavy-lanes-test']
    wait_until(lambda: node()['acks_unsettled'] == 0, timeout=10, interval=0.3, message='the lost ack settled')
    assert node()['acks_failed_total'] >= 1
