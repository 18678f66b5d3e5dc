"""The documented rollout, shadow first and then enforce, through the API onto a real worker process: the
Retry-After of the first refusals in enforce is what a refused caller would wait, not the queue wait of
the calls shadow mode let past the limit."""
import math

import pytest

from capacity.keys import holds_key, run_field
from capacity.store import get_store
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS, submit
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]

BURST = 6
ROOMY = {'staff': 99, 'core': 99, 'early_access': 99, 'preview': 99}


def submit_long(client, source):
    return submit(client, source, rows=LONG_ROWS, reranker=True, limit=100)


def test_after_a_shadow_burst_an_enforced_refusal_says_to_retry_within_twice_the_run_time(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    # es2_knn is the one lane that fills: its bulk limit is 1 (2 - the single-row reserve), its pool 1.
    configure(es2_knn=2, api_heavy={'cluster': 99, 'per_task': 99}, tiers=ROOMY, per_user=ROOMY)
    start_worker(name='knn', queues=('es2_knn',), concurrency=1)
    client = api_as(make_user())
    # A warm pool process: its first call loads what every later one finds loaded (the model's session),
    # and is measured as a hold in no lane here.
    warm = submit(client, tiny_source, reranker=True)
    wait_until(lambda: Work.objects.filter(pk=warm.json()['id'], state='succeeded').exists(), timeout=120,
               interval=0.2, message='the warm-up call to run')
    wait_until(lambda: lanes_redis.hget(holds_key(), run_field('es2_knn')), timeout=10, message='its release')
    lanes_redis.delete(holds_key())

    burst = [submit_long(client, tiny_source) for _ in range(BURST)]
    assert [response.status_code for response in burst] == [202] * BURST
    decisions = [response['X-OCL-Capacity-Decision'] for response in burst]
    assert decisions == ['admitted'] + ['shadow-refused'] * (BURST - 1)  # shadow lets them all queue
    ids = [response.json()['id'] for response in burst]
    wait_until(lambda: Work.objects.filter(pk__in=ids, state='succeeded').count() == BURST, timeout=180,
               interval=0.2, message='the burst to run')
    wait_until(lambda: lanes_redis.hget(holds_key(), run_field('es2_knn') + '|n') == str(BURST).encode(),
               timeout=10, message='every run of the burst to be measured')
    run_ms = get_store().hold(run_field('es2_knn'))

    configure(mode='enforce', enforce_for='all')
    held = submit_long(client, tiny_source)
    assert held.status_code == 202 and held['X-OCL-Capacity-Decision'] == 'admitted', held.content
    refused = submit_long(client, tiny_source)
    assert refused.status_code == 429 and refused.json()['scope'] == 'es2_knn', refused.content
    # The slot frees when the one call holding it ends: about one run away. The shadow-refused calls waited
    # up to BURST - 1 runs in the queue; measured as holds, they made this several runs.
    within = max(1, math.ceil(2 * run_ms / 1000))
    assert int(refused['Retry-After']) <= within, (refused['Retry-After'], run_ms, get_store().holds())
