"""Identical calls on the real stack (two gunicorn API processes, a prefork lane worker, a private Redis),
with sharing across users on: 20 identical calls from 4 users run their work once; cancelling all but one
handle leaves the work to the last, cancelling all cancels it; a work that fails fails every handle with its
error. No lease is left."""
import json
import re
import threading

import pytest
import requests

from concepts.models import Source
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS
from workers.models import Call, Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
FINAL = ('succeeded', 'failed', 'cancelled', 'expired')
WIDE = {'staff': 40, 'core': 40, 'early_access': 40, 'preview': 40}


def post(url, token, source, prefer=None, rows=LONG_ROWS):
    headers = {'Authorization': f'Token {token}'}
    if prefer:
        headers['Prefer'] = prefer
    return requests.post(f'{url}/concepts/$match/?semantic=true&reranker=true',
                         json={'rows': rows, 'target_repo_url': source, 'limit': 100}, headers=headers, timeout=120)


def at_once(jobs):
    """Run the callables `jobs` in threads started together; their results in order."""
    results = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(index, job):
        barrier.wait()
        results[index] = job()
    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return results


def poll(url, token, call_id, until=FINAL, timeout=120):
    return wait_until(lambda: (lambda body: body if body['state'] in until else None)(requests.get(
        f'{url}/tasks/{call_id}/?wait=5', headers={'Authorization': f'Token {token}'}, timeout=30).json()),
        timeout=timeout, interval=0.1, message=f'{call_id} to reach {until}')


def capacity_lines(stack, worker):
    lines = []
    for text in [worker.output(), *(child.output() for child in stack.apis)]:
        for line in text.splitlines():
            if line.startswith('{') and '"ocl_capacity"' in line:
                record = json.loads(line)
                if record.get('event') == 'ocl_capacity':
                    lines.append(record)
    return lines


def served_metric(url, served_as):
    text = requests.get(f'{url}/metrics', timeout=10).text
    values = re.findall(rf'^heavy_lanes_calls_served_total{{queue="es2_knn",served_as="{served_as}"}} (\S+)$',
                        text, re.MULTILINE)
    return float(values[0]) if values else 0.0


@pytest.fixture
def stack(fault_stack, configure):
    configure(es2_knn=3, per_user=WIDE, tiers=WIDE, api_heavy={'cluster': 40, 'per_task': 40})
    fault_stack.common['HEAVY_LANES_SHARE_ACROSS_USERS'] = 'true'  # four users' identical calls share
    return fault_stack


def test_twenty_identical_calls_from_four_users_through_two_apis_run_once(stack, tiny_source, make_user):
    urls = [stack.api('api-a', threads=20), stack.api('api-b', threads=20)]
    worker = stack.worker(name='knn', queues=('es2_knn',))
    users = [make_user() for _ in range(4)]
    tokens = [user.auth_token.key for user in users]
    # Half the clients wait in the request (OCL's drop-in), half take a handle and poll.
    jobs = [(lambda i=i: (i, post(urls[i % 2], tokens[i % 4], tiny_source,
                                  prefer='respond-async' if i % 2 else None))) for i in range(20)]
    answers = at_once(jobs)
    waited = [response for i, response in answers if i % 2 == 0]
    handles = [(i, response) for i, response in answers if i % 2]
    assert {response.status_code for response in waited} == {200}, [r.content[:300] for r in waited]
    assert len({response.content for response in waited}) == 1  # byte for byte
    body = waited[0].json()
    ids = {i: response.json()['id'] for i, response in handles}
    ids.update({i: response.headers['Content-Location'].split('/')[2] for i, response in answers if i % 2 == 0})
    for i, call_id in ids.items():
        if i % 2:
            task = poll(urls[0], tokens[i % 4], call_id)
            assert task['state'] == 'succeeded' and task['result'] == body
        other = tokens[(i + 1) % 4]  # each handle is its owner's alone
        assert requests.get(f'{urls[1]}/tasks/{call_id}/', headers={'Authorization': f'Token {other}'},
                            timeout=10).status_code == 404
    calls = Call.objects.filter(pk__in=ids.values())
    assert sorted(call.served_as for call in calls) == ['coalesced'] * 19 + ['run']
    [work] = Work.objects.filter(calls__in=calls).distinct()  # one work for the 20 calls
    assert work.attempts == 1  # one worker execution
    assert {call.owner_id for call in calls} == {user.pk for user in users}
    lines = [line for line in capacity_lines(stack, worker) if line['task_id'] in ids.values()]
    assert sorted(line['served_as'] for line in lines) == ['coalesced'] * 19 + ['run']
    assert served_metric(urls[0], 'run') == 1 and served_metric(urls[1], 'coalesced') == 19
    assert stack.leases() == 0


def test_cancelling_all_handles_but_one_leaves_the_work_and_cancelling_all_cancels_it(
        stack, tiny_source, make_user):
    url = stack.api('api-a', threads=20)
    users = [make_user() for _ in range(4)]
    tokens = [user.auth_token.key for user in users]

    def handles(rows):
        answers = at_once([lambda i=i: post(url, tokens[i % 4], tiny_source, 'respond-async', rows)
                           for i in range(20)])
        assert {response.status_code for response in answers} == {202}
        calls = [(tokens[i % 4], response.json()['id']) for i, response in enumerate(answers)]
        return calls, Call.objects.get(pk__in=[call_id for _, call_id in calls], served_as='run')

    def cancel(token, call_id):
        return requests.delete(f'{url}/tasks/{call_id}/', headers={'Authorization': f'Token {token}'}, timeout=30)

    # All 20 cancelled (from 20 threads at once): so is the work, and its leases go back.
    again = [{**row, 'name': row['name'] + ' again'} for row in LONG_ROWS]
    calls, leader = handles(again)
    assert stack.leases() > 0
    answers = at_once([lambda c=c: cancel(*c) for c in calls])
    assert {response.json()['state'] for response in answers} == {'cancelled'}
    assert Work.objects.get(pk=leader.pk).state == 'cancelled'
    assert stack.leases() == 0
    # 19 of 20 cancelled: the work goes on for the 20th.
    stack.worker(name='knn', queues=('es2_knn',))
    calls, leader = handles(LONG_ROWS)
    last = next((token, call_id) for token, call_id in calls if call_id != leader.pk)
    for token, call_id in calls:
        if call_id != last[1]:
            assert cancel(token, call_id).json()['state'] == 'cancelled'
    assert poll(url, *last)['state'] == 'succeeded'
    assert Work.objects.get(pk=leader.pk).state == 'succeeded'  # the work's; its owner sees cancelled
    assert poll(url, *next(c for c in calls if c[1] == leader.pk))['state'] == 'cancelled'
    assert Work.objects.get(pk=leader.pk).attempts == 1
    wait_until(lambda: stack.leases() == 0, timeout=10, message='the leases to go back')


def test_a_leader_that_fails_fails_every_handle_with_its_error(stack, tiny_source, make_user):
    url = stack.api('api-a', threads=20)
    tokens = [make_user().auth_token.key for _ in range(3)]
    rows = [{'name': 'fever'}]
    answers = [post(url, token, tiny_source, 'respond-async', rows) for token in tokens]
    assert {response.status_code for response in answers} == {202}
    Source.objects.filter(org='HL', mnemonic='TinyClinical').delete()  # gone before a worker runs the call
    stack.worker(name='knn', queues=('es2_knn', 'interactive'))
    tasks = [poll(url, token, response.json()['id']) for token, response in zip(tokens, answers)]
    assert {task['state'] for task in tasks} == {'failed'}
    assert len({task['error'] for task in tasks}) == 1 and 'target_repo_url' in tasks[0]['error']
    assert Call.objects.filter(served_as='coalesced', work__state='failed').count() == 2
    assert stack.leases() == 0
