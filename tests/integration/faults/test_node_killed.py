"""A lane worker node killed whole (SIGKILL of every process of it) while it runs a call, on the real stack
(gunicorn, the test's own redis-server, beat and the sweep): the call runs again on a live node within about
`lease_seconds` plus a sweep, not at the broker's visibility timeout an hour later, and ends as it would have;
it is never ended `cancelled` by a message of it that came back late, and no lease is left."""
import time

import pytest
import requests

from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS
from workers import messages
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
LEASE_SECONDS, RENEW_SECONDS, SWEEP_SECONDS = 15, 5, 1


def test_a_call_whose_node_was_killed_runs_again_on_a_live_node_within_a_lease(
        fault_stack, configure, tiny_source, make_user):
    configure(lease_seconds=LEASE_SECONDS, renew_seconds=RENEW_SECONDS, max_hold_seconds=120)
    fault_stack.common.update(WORKERS_SWEEP_SECONDS=SWEEP_SECONDS, WORKERS_SWEEP_GRACE_SECONDS=3)
    url = fault_stack.api('api-a')
    fault_stack.maintenance(sweep_seconds=SWEEP_SECONDS, grace_seconds=3)
    doomed = fault_stack.worker(name='doomed', queues=('es2_knn',))
    token = make_user('core_user').auth_token.key
    answer = requests.post(f'{url}/concepts/$match/?semantic=true&reranker=true&limit=100',
                           json={'rows': LONG_ROWS, 'target_repo_url': tiny_source},
                           headers={'Authorization': f'Token {token}', 'Prefer': 'respond-async'}, timeout=60)
    assert answer.status_code == 202, answer.text
    work_id = answer.json()['id']
    wait_until(lambda: Work.objects.filter(pk=work_id, state='running').exists(), timeout=60, interval=0.02,
               message='the call to start')
    doomed.kill()  # SIGKILL to its process group: the node's main process and its pool process
    killed = time.time()
    assert work_id in {entry.call_id for entry in messages.snapshot(['es2_knn'], fault_stack.broker()).held}

    fault_stack.worker(name='alive', queues=('es2_knn',))
    task = wait_until(lambda: (lambda body: body if body['state'] in ('succeeded', 'failed', 'cancelled',
                                                                      'expired') else None)(
        requests.get(f'{url}/tasks/{work_id}/', headers={'Authorization': f'Token {token}'}, timeout=30).json()),
        timeout=LEASE_SECONDS + 90, interval=0.5, message='the call to run again and end')
    assert task['state'] == 'succeeded', task
    started_again = Work.objects.get(pk=work_id)
    assert started_again.attempts == 2 and started_again.worker.startswith('alive@')
    # Taken over once its heartbeat was stale (lease_seconds by the database's clock) and a sweep saw it:
    # within about a lease, where the broker's visibility timeout would have taken an hour.
    assert started_again.started_at.timestamp() - killed <= LEASE_SECONDS + 5 + 3 * SWEEP_SECONDS + 15
    wait_until(lambda: fault_stack.leases() == 0, timeout=LEASE_SECONDS + 10, interval=0.2,
               message='no lease left')
    assert fault_stack.messages() == set()  # the dead node's unacknowledged entry is gone too
