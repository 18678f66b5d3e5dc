"""The real Redis (the lanes and the broker) emptied with FLUSHALL while calls wait in their queues, on the
real stack (gunicorn, a prefork lane worker, beat and the maintenance worker sweeping): every call that
answered 202 ends, run once from the message the sweep sends again, or `expired` at its deadline when its
queue has no worker; none stays `queued` past its deadline, no lease is left, and the stack takes new
calls as before."""
import re
from datetime import timedelta

import pytest
import requests
from django.utils import timezone
from django_celery_results.models import TaskResult

from tests.integration.calls import distinct
from tests.integration.faults.load import FINAL, capacity_lines, wait_all_ended
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS, ROWS
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
# The queued calls run once the two long ones free the pool: those took long enough on a loaded CI machine
# (beside the cluster run) that a queued call met a 20 s deadline before the pool freed up.
DEADLINE_SECONDS = 30
SWEEP_SECONDS = 1


def post(url, token, source, rows, **params):
    response = requests.post(f'{url}/concepts/$match/', params={'semantic': 'true', **params}, json={
        'rows': distinct(rows), 'target_repo_url': source}, headers={
        'Authorization': f'Token {token}', 'Prefer': 'respond-async'}, timeout=30)
    assert response.status_code == 202, response.content
    return response.json()['id']


def test_calls_queued_when_redis_is_flushed_all_end_and_none_stays_queued(
        fault_stack, configure, tiny_source, make_user):
    wide = {'staff': 40, 'core': 40, 'early_access': 40, 'preview': 40}
    configure(cache={'ttl_seconds': 0}, lease_seconds=15, renew_seconds=5, per_user=wide, tiers=wide,
              queue={'deadline_seconds': DEADLINE_SECONDS})
    url = fault_stack.api()
    worker = fault_stack.worker(name='knn', queues=('es2_knn',))  # no worker for `interactive`
    maintenance = fault_stack.maintenance(sweep_seconds=SWEEP_SECONDS, grace_seconds=2)
    wait_until(lambda: (fault_stack.status()['queues']['es2_knn']['workers'].get(worker.node) or {}).get(
        'processes') == 2, timeout=30, interval=0.2, message='a pool of two')
    token = make_user().auth_token.key

    # Two long calls take the pool (their messages taken, unacknowledged); four more wait on es2_knn's
    # list and two single-row calls on `interactive`'s, which no worker serves.
    running = [post(url, token, tiny_source, LONG_ROWS, reranker='true', limit='100') for _ in range(2)]
    wait_until(lambda: Work.objects.filter(pk__in=running, state='running').count() == 2, timeout=60,
               interval=0.02, message='the long calls to run')
    waiting = [post(url, token, tiny_source, ROWS) for _ in range(4)]
    unserved = [post(url, token, tiny_source, ROWS[:1]) for _ in range(2)]
    assert set(waiting + unserved + running) <= fault_stack.messages()
    assert fault_stack.leases() > 0

    client = fault_stack.lanes()
    client.flushall()
    client.close()
    assert not fault_stack.messages() and fault_stack.leases() == 0

    ids = running + waiting + unserved
    # Every call ends; one whose deadline passed is never left queued (the sweep ends it within a sweep).
    deadline = max(Work.objects.get(pk=i).expires_at for i in ids)
    wait_all_ended(ids, timeout=DEADLINE_SECONDS + 30, late_seconds=3 * SWEEP_SECONDS)
    assert timezone.now() < deadline + timedelta(seconds=10)
    calls = {call.pk: call for call in Work.objects.filter(pk__in=ids)}
    assert {calls[i].state for i in running + waiting} == {'succeeded'}  # ran: sent again by the sweep
    assert {calls[i].state for i in unserved} == {'expired'}
    resent = sum(int(count) for line in maintenance.output().splitlines() if 'Sweep: ' in line
                 for count in re.findall(r"'resent': (\d+)", line))
    assert resent >= len(waiting + unserved)  # their messages were gone: only the sweep could run them

    # None ran twice: one claim each, one result, one line of its end.
    assert {i: calls[i].attempts for i in running + waiting} == dict.fromkeys(running + waiting, 1)
    assert {i: calls[i].attempts for i in unserved} == dict.fromkeys(unserved, 0)
    results = TaskResult.objects.filter(task_id__in=ids, status='SUCCESS').values_list('task_id', flat=True)
    assert sorted(results) == sorted(running + waiting)
    ends = [line['task_id'] for line in capacity_lines([worker, maintenance, *fault_stack.apis])
            if line.get('task_id') in calls and line.get('state') in FINAL]
    assert sorted(ends) == sorted(ids)
    wait_until(lambda: fault_stack.leases() == 0, timeout=10,
               message=f'no lease left: {fault_stack.lease_members()}')

    # The stack goes on: a new call is queued and runs, and gives its leases back.
    after = post(url, token, tiny_source, ROWS)
    wait_until(lambda: Work.objects.get(pk=after).state == 'succeeded', timeout=30,
               message='a new call to run')
    assert Work.objects.get(pk=after).attempts == 1
    wait_until(lambda: fault_stack.leases() == 0, timeout=10, message='its leases to go back')
