"""A call's broker message delivered twice, injected by hand as a Redis stall or a restore makes it: the
very list entry pushed again (what redis-py's retry of a publish that timed out leaves, byte for byte), on
the real stack (gunicorn, two prefork lane worker nodes of one process each, the test's own
redis-server). Whether the copy arrives before the call starts (the two nodes take one copy each), while
it runs (the other node takes the copy), or after it ended, the call runs once: one worker claim
(attempts 1), one result, one log line of its end, and no lease left."""
import re

import pytest
import requests
from django_celery_results.models import TaskResult

from tests.integration.calls import distinct
from tests.integration.faults.inject import push_copy, taken_entry, waiting_entry
from tests.integration.faults.load import capacity_lines
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS, ROWS
from workers import messages
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def post(url, token, source, rows, **params):
    response = requests.post(f'{url}/concepts/$match/', params={'semantic': 'true', **params}, json={
        'rows': distinct(rows), 'target_repo_url': source}, headers={
        'Authorization': f'Token {token}', 'Prefer': 'respond-async'}, timeout=30)
    assert response.status_code == 202, response.content
    return response.json()['id']


def deliveries(workers, call_id, what='received|succeeded|retry'):
    """{received, succeeded, retry}: how often the workers received the call's message and handled a
    delivery (run it or dropped it: Celery's `succeeded`; put it off to look again once the running
    worker's heartbeat would be stale: `retry`)."""
    counts = dict.fromkeys(what.split('|'), 0)
    for worker in workers:
        for found in re.findall(rf'run_heavy_call\[{call_id}\]:? ({what})', worker.output()):
            counts[found] += 1
    return counts


def all_handled(workers, call_id):
    counts = deliveries(workers, call_id)
    return counts['received'] == counts['succeeded'] + counts['retry']


def test_a_duplicate_message_runs_its_call_once_before_while_and_after_it_runs(
        fault_stack, configure, tiny_source, make_user):
    # es2_knn 1: the lane is paused (a pool of 0), so the first call waits on its list.
    configure(es2_knn=1, cache={'ttl_seconds': 0}, lease_seconds=15, renew_seconds=5)
    url = fault_stack.api()
    token = make_user().auth_token.key
    broker = fault_stack.broker()
    workers = [fault_stack.worker(name=name, queues=('es2_knn',)) for name in ('knn-a', 'knn-b')]

    # Before it starts: its message is on the list twice when the lane resumes (a pool of 2: one process
    # on each node), and the two nodes take a copy each at once.
    early = post(url, token, tiny_source, ROWS)
    name, raw = waiting_entry(broker, early)
    broker.lpush(name, raw)
    assert sum(messages.message_id(entry) == early for entry in broker.lrange(name, 0, -1)) == 2
    configure(es2_knn=3)
    wait_until(lambda: Work.objects.get(pk=early).state == 'succeeded', timeout=60,
               message='the call to run')
    wait_until(lambda: all((fault_stack.status()['queues']['es2_knn']['workers'].get(w.node) or {}).get(
        'processes') == 1 for w in workers), timeout=30, interval=0.2, message='a pool of one on each node')

    # While it runs: a long call's taken message is pushed back onto its queue; the other node takes the
    # copy while the first runs the call.
    running = post(url, token, tiny_source, LONG_ROWS, reranker='true', limit='100')
    wait_until(lambda: Work.objects.get(pk=running).state == 'running', timeout=60, interval=0.02,
               message='the long call to run')
    taken = wait_until(lambda: taken_entry(broker, running), timeout=10, interval=0.02, message='its message')
    push_copy(broker, taken, 'es2_knn')
    wait_until(lambda: deliveries(workers, running)['retry'] == 1, timeout=10, interval=0.02,
               message='the copy to meet the call running on the other node')
    assert Work.objects.get(pk=running).state == 'running'

    # After it ended: the first call's message once more.
    broker.lpush(name, raw)

    ids = [early, running]
    rows = {early: len(ROWS), running: len(LONG_ROWS)}
    wait_until(lambda: all(Work.objects.get(pk=i).state == 'succeeded' for i in ids), timeout=60,
               message='both calls to succeed')
    # Every delivery is handled (a copy that met the call running looks again once its heartbeat would be
    # stale, lease_seconds), and the broker holds nothing of them.
    wait_until(lambda: deliveries(workers, early)['received'] >= 3
               and all(all_handled(workers, i) for i in ids) and not fault_stack.messages(), timeout=60, interval=0.5,
               message=f'every copy handled: {[deliveries(workers, i) for i in ids]}')

    for call_id in ids:
        call = Work.objects.get(pk=call_id)
        assert (call.state, call.attempts) == ('succeeded', 1)
        assert TaskResult.objects.filter(task_id=call_id).count() == 1
        ends = [line for line in capacity_lines(workers) if line.get('task_id') == call_id]
        assert [line['state'] for line in ends] == ['succeeded']
        task = requests.get(f'{url}/tasks/{call_id}/', headers={'Authorization': f'Token {token}'},
                            timeout=10).json()
        assert task['state'] == 'succeeded' and len(task['result']) == rows[call_id]
    assert fault_stack.leases() == 0
    broker.close()
