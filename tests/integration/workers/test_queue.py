"""Heavy calls through the API onto real Celery worker processes (real Redis broker and lanes)."""
import json
import os
import signal
import time

import pytest

from capacity.constants import Lane
from capacity.keys import lane_key
from tests.integration.calls import distinct
from tests.integration.workers.conftest import wait_until
from workers import lifecycle
from workers.celery import TASK_NAME
from workers.models import Call, Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]

ROWS = [{'name': 'high blood pressure'}, {'name': 'sugar diabetes'}, {'name': 'heart attack'}]


def submit(client, source, rows=ROWS, semantic=True, reranker=False, headers=None, same=False, **params):
    """A polling client's submission (a handle at once): Prefer: respond-async unless `headers` say. A
    work of its own unless `same` (identical calls share one run)."""
    rows = rows if same else distinct(rows)
    flags = '&'.join(f'{k}=true' for k, v in (('semantic', semantic), ('reranker', reranker)) if v)
    return client.post(f'/concepts/$match/?{flags}', {'rows': rows, 'target_repo_url': source, **params},
                       format='json', **{'HTTP_PREFER': 'respond-async', **(headers or {})})


def poll(client, call_id, until=('succeeded', 'failed', 'cancelled', 'expired'), timeout=30):
    return wait_until(lambda: (lambda r: r if r.json()['state'] in until else None)(
        read_whole(client.get(f'/tasks/{call_id}/'))), timeout=timeout, message=f'task {call_id} to reach {until}')


def read_whole(response):
    """A streamed answer (a stored result over RESULT_SLICE_CHARACTERS) read whole, as an HTTP client reads it."""
    if response.streaming:
        content = b''.join(response.streaming_content)
        response.json = lambda: json.loads(content)
    return response


def log_line_of(worker, call_id):
    """The `ocl_capacity` JSON line a worker printed for a call, or None."""
    for text in worker.output().splitlines():
        if text.startswith('{') and call_id in text:
            record = json.loads(text)
            if record.get('event') == 'ocl_capacity' and record.get('task_id') == call_id:
                return record
    return None


def lane_has(redis_client, lane, token, *parts):
    return redis_client.zscore(lane_key(lane, *parts), token) is not None


def released(check):
    """Wait for `check()` (no lease left): a worker records a call's end, then gives its leases back, so a
    poll can see the call ended a moment before the release reaches Redis on a loaded machine."""
    wait_until(check, timeout=5, interval=0.05, message='the leases to be released')


def test_a_call_is_queued_then_runs_and_only_its_owner_and_staff_see_it(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)  # es2_knn pool = 1 - reserve 1 = 0: the lane is paused, calls wait
    worker = start_worker()
    owner = make_user()
    client = api_as(owner)
    response = submit(client, tiny_source)
    assert response.status_code == 202, response.content
    body = response.json()
    call_id = body['id']
    assert response['Location'] == f'/tasks/{call_id}/'
    assert body['state'] == 'queued' and body['lane'] == 'es2_knn' and body['endpoint'] == '$match'
    assert response['X-OCL-Capacity-Decision'] == 'shadow-refused'  # es2_knn bulk limit is 0

    queued = client.get(f'/tasks/{call_id}/')
    assert queued.json()['state'] == 'queued' and queued.json()['position'] == 1
    assert int(queued['Retry-After']) >= 1
    assert lane_has(lanes_redis, Lane.ES2_KNN, call_id) and lane_has(lanes_redis, Lane.USER, call_id, owner.pk)

    configure(es2_knn=3)  # pool 2: the worker starts consuming again
    done = poll(client, call_id)
    task = done.json()
    assert task['state'] == 'succeeded', task
    assert 'Retry-After' not in done
    assert task['created_at'] <= task['started_at'] <= task['finished_at']
    answer = task['result']
    assert [entry['row']['name'] for entry in answer] == [row['name'] for row in ROWS]
    assert answer[0]['results'][0]['display_name'] == 'Hypertension'
    released(lambda: not lane_has(lanes_redis, Lane.ES2_KNN, call_id)
             and not lane_has(lanes_redis, Lane.USER, call_id, owner.pk))
    from django_celery_results.models import TaskResult  # the result row, with the task's extended fields
    stored = TaskResult.objects.get(task_id=call_id)
    assert (stored.status, stored.task_name, stored.task_args) == ('SUCCESS', TASK_NAME, f'"[\'{call_id}\']"')
    assert stored.worker == worker.node, stored.worker

    line = wait_until(lambda: log_line_of(worker, call_id), timeout=5, message='the call\'s log line')
    assert line['event'] == 'ocl_capacity' and line['decision'] == 'shadow-refused'
    assert (line['queue'], line['state'], line['user_id']) == ('es2_knn', 'succeeded', owner.pk)
    assert line['wait_ms'] >= 0 and line['run_ms'] >= 0 and line['held_ms'] >= line['run_ms']

    assert api_as(make_user()).get(f'/tasks/{call_id}/').status_code == 404
    assert api_as(make_user()).delete(f'/tasks/{call_id}/').status_code == 404
    assert api_as(make_user(is_staff=True)).get(f'/tasks/{call_id}/').json()['state'] == 'succeeded'
    assert client.get('/tasks/0123456789abcdef0123456789abcdef/').status_code == 404


LONG_ROWS = [{'name': f'high blood pressure with chest pain and fever, case {i}'} for i in range(1000)]


def submit_long(client, source):
    """A real call that takes a worker a second or two: 1000 rows, semantic and reranked, 100 candidates."""
    response = submit(client, source, rows=LONG_ROWS, reranker=True, limit=100)
    assert response.status_code == 202, response.content
    return response.json()['id']


def running_pid(call_id, timeout=30):
    call = wait_until(lambda: Work.objects.filter(pk=call_id, state='running').first(), timeout=timeout,
                      interval=0.01, message=f'{call_id} to run')
    return int(call.worker.rsplit(' ', 1)[1])


def worker_keys(call):
    """The lanes the call's worker renews and releases."""
    return call.lease['keys']


def holds(redis_client, call_id):
    """How many of the call's lanes still hold an unexpired lease for it."""
    call = Work.objects.get(pk=call_id)
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000
    return sum(1 for key in worker_keys(call) if (redis_client.zscore(key, call_id) or 0) > now_ms)


def test_a_killed_pool_process_gets_its_call_delivered_again_at_once(
        start_worker, tiny_source, make_user, api_as, lanes_redis):
    from django_celery_results.models import TaskResult
    start_worker(concurrency=1)
    client = api_as(make_user())
    call_id = submit_long(client, tiny_source)
    os.kill(running_pid(call_id), signal.SIGKILL)
    task = poll(client, call_id, timeout=60).json()
    assert task['state'] == 'succeeded'
    call = Work.objects.get(pk=call_id)
    assert call.attempts == 2
    assert TaskResult.objects.filter(task_id=call_id).count() == 1
    assert len(task['result']) == 1000
    released(lambda: holds(lanes_redis, call_id) == 0)


def test_a_killed_worker_node_frees_its_leases_and_its_call_runs_again_after_the_visibility_timeout(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(lease_seconds=15, renew_seconds=5)
    first = start_worker(name='doomed', CELERY_VISIBILITY_TIMEOUT=8)
    client = api_as(make_user())
    call_id = submit_long(client, tiny_source)
    running_pid(call_id)
    assert holds(lanes_redis, call_id) == len(worker_keys(Work.objects.get(pk=call_id)))
    killed_at = time.monotonic()
    first.kill()
    wait_until(lambda: holds(lanes_redis, call_id) == 0, timeout=17, interval=0.2, message='leases to expire')
    assert time.monotonic() - killed_at <= 16
    start_worker(name='rescuer', CELERY_VISIBILITY_TIMEOUT=8)
    task = poll(client, call_id, timeout=60).json()
    assert task['state'] == 'succeeded'
    call = Work.objects.get(pk=call_id)
    assert call.attempts == 2 and call.worker.startswith('rescuer@')
    released(lambda: holds(lanes_redis, call_id) == 0)


def test_cancelling_a_queued_call_and_a_running_call(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)  # es2_knn paused: the first call waits in its queue
    start_worker(concurrency=1)
    client = api_as(make_user('core_user'))
    queued = submit(client, tiny_source).json()['id']
    assert holds(lanes_redis, queued) > 0
    cancelled = client.delete(f'/tasks/{queued}/')
    assert cancelled.status_code == 200 and cancelled.json()['state'] == 'cancelled'
    assert holds(lanes_redis, queued) == 0
    assert client.delete(f'/tasks/{queued}/').status_code == 409

    configure(es2_knn=3)
    running = submit_long(client, tiny_source)
    pid = running_pid(running)
    response = client.delete(f'/tasks/{running}/')
    assert response.status_code == 200 and response.json()['state'] == 'cancelled'
    # Its leases go back once its work has stopped: the pool process running it is terminated.
    wait_until(lambda: not pid_alive(pid), timeout=10, message='the running call stopped')
    wait_until(lambda: holds(lanes_redis, running) == 0, timeout=10, message='its leases released')
    assert lifecycle.result(Call.objects.get(pk=running)) is None
    # The worker goes on: a new call runs, and the cancelled ones stay cancelled and never ran again.
    after = submit(client, tiny_source).json()['id']
    assert poll(client, after).json()['state'] == 'succeeded'
    assert Work.objects.get(pk=queued).attempts == 0
    assert Work.objects.get(pk=queued).state == 'cancelled'
    assert Work.objects.get(pk=running).state == 'cancelled'


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pool_of(node):
    from workers.celery import app
    stats = app.control.inspect([node], timeout=2).stats() or {}
    return len(stats.get(node, {}).get('pool', {}).get('processes', []))


def test_a_limit_change_resizes_a_running_workers_pool_and_zero_pauses_the_lane(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    worker = start_worker(name='knn', queues=('es2_knn',), concurrency=1)
    configure(es2_knn=4)  # pool 4 - 1 reserved = 3
    wait_until(lambda: pool_of(worker.node) == 3, timeout=10, interval=0.3, message='the pool to grow to 3')
    configure(es2_knn=2)
    wait_until(lambda: pool_of(worker.node) == 1, timeout=10, interval=0.3, message='the pool to shrink to 1')
    configure(es2_knn=1, mode='enforce')  # pool 0: stop consuming
    from capacity.config import get_current
    from workers.status import get_queues
    wait_until(lambda: not get_queues(get_current()[1])['es2_knn']['consumers'], timeout=10, interval=0.3,
               message='the lane to pause')
    client = api_as(make_user())
    refused = submit(client, tiny_source, headers={'HTTP_X_OCL_EVENT_METADATA': '{"capacity_aware": "true"}'})
    assert refused.status_code == 429
    assert refused['Retry-After'] == '120' and refused.json()['paused'] is True
    assert refused.json()['scope'] == 'es2_knn'
    queued = submit(client, tiny_source)  # an unaware client is admitted (shadow-refused) and waits
    assert queued.status_code == 202
    time.sleep(1.5)
    assert client.get(f"/tasks/{queued.json()['id']}/").json()['state'] == 'queued'


def test_with_a_lane_limit_of_two_no_more_than_two_calls_run_at_once(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(api_heavy={'cluster': 3, 'per_task': 2}, per_user={'staff': 20, 'core': 20, 'early_access': 20,
                                                                  'preview': 20},
              tiers={'staff': 20, 'core': 20, 'early_access': 20, 'preview': 20})
    worker = start_worker(name='heavy', queues=('api_heavy',), concurrency=1)
    wait_until(lambda: pool_of(worker.node) == 2, timeout=10, interval=0.3, message='the pool to grow to 2')
    client = api_as(make_user())
    rows = [{'name': f'chest pain {i}', 'synonyms': [f'pain in the chest {j}' for j in range(20)]} for i in range(400)]
    ids = []
    # The node is stopped while the calls are sent, so they are all waiting when it takes them: a call
    # that ran faster than the next one was sent would leave the lane's second slot unused. Twenty, so the
    # queue outlasts a second pool process that is slow to take its first call on a loaded machine (once
    # in CI, ten calls all ran on the first process: peak 1).
    worker.kill(signal.SIGSTOP)
    try:
        for _ in range(20):
            body = {'q': 'chest pain radiating to the arm', 'rows': distinct(rows)}
            response = client.post('/concepts/$rerank/', body, HTTP_PREFER='respond-async', format='json')
            assert response.status_code == 202, response.content
            ids.append(response.json()['id'])
    finally:
        worker.kill(signal.SIGCONT)
    for call_id in ids:
        assert poll(client, call_id, timeout=120).json()['state'] == 'succeeded'
    calls = Work.objects.filter(pk__in=ids)
    events = sorted([(c.started_at, 1) for c in calls] + [(c.finished_at, -1) for c in calls])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 2, [(c.started_at, c.finished_at, c.work_key[:8]) for c in calls]
    assert peak == 2  # the lane was used to its limit
    released(lambda: all(holds(lanes_redis, call_id) == 0 for call_id in ids))


def test_an_expired_call_ends_expired_and_never_runs(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1, lease_seconds=15, renew_seconds=5,
              queue={'deadline_seconds': 15, 'max_waiting': {'interactive': 0, 'es2_knn': 0, 'api_heavy': 0}})
    start_worker(concurrency=1)
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']
    time.sleep(15.2)
    task = client.get(f'/tasks/{call_id}/').json()
    assert task['state'] == 'expired' and task['started_at'] is None
    assert holds(lanes_redis, call_id) == 0
    configure(es2_knn=3)  # the worker now receives the message, after its deadline
    time.sleep(2)
    call = Work.objects.get(pk=call_id)
    assert call.state == 'expired' and call.attempts == 0


def test_a_worker_started_while_its_lane_is_paused_takes_no_call_until_the_lane_resumes(
        start_worker, tiny_source, make_user, api_as, configure, lanes_redis):
    configure(es2_knn=1)  # es2_knn's pool size is 0
    client = api_as(make_user())
    call_id = submit(client, tiny_source).json()['id']  # waiting before any worker exists
    start_worker(name='knn-only', queues=('es2_knn',))
    time.sleep(2)
    assert client.get(f'/tasks/{call_id}/').json()['state'] == 'queued'
    configure(es2_knn=3)
    assert poll(client, call_id).json()['state'] == 'succeeded'


def test_a_node_shrunk_while_its_calls_ran_holds_no_more_calls_than_its_processes(
        start_worker, tiny_source, make_user, api_as, configure):
    """billiard can't stop a busy process and Celery's pool_shrink then leaves the prefetch count as it was:
    without CELERY_WORKER_DISABLE_PREFETCH this one-process node took the second call off the broker."""
    from workers.status import depth
    worker = start_worker(name='knn', queues=('es2_knn',), concurrency=1)
    client = api_as(make_user(is_staff=True))
    configure(es2_knn=4)  # pool 3
    wait_until(lambda: pool_of(worker.node) == 3, timeout=15, interval=0.3, message='the pool to grow to 3')
    busy = [submit_long(client, tiny_source) for _ in range(2)]
    for call_id in busy:
        running_pid(call_id)
    configure(es2_knn=2)  # pool 1, while two of its three processes are busy
    wait_until(lambda: pool_of(worker.node) == 1, timeout=60, interval=0.3, message='the pool to shrink to 1')
    for call_id in busy:
        assert poll(client, call_id, timeout=60).json()['state'] == 'succeeded'
    ids = [submit_long(client, tiny_source) for _ in range(2)]
    running_pid(ids[0])
    for _ in range(5):
        states = [Work.objects.get(pk=call_id).state for call_id in ids]
        assert (states.count('running'), depth('es2_knn')) == (1, 1), states  # the second waits on the broker
        time.sleep(0.1)
    for call_id in ids:
        assert poll(client, call_id, timeout=60).json()['state'] == 'succeeded'


def test_a_limit_lowered_while_every_process_is_busy_is_the_nodes_width_at_once(
        start_worker, tiny_source, make_user, api_as, configure):
    """Four calls hold a pool of four (stopped, so they stay busy), the lane is lowered to a pool of one,
    three calls wait, and the four are let go: from then on the node runs one call at a time, though
    billiard can only stop its processes once they are idle. Before, each process that finished took a
    waiting call (4 at once) until a later shrink landed."""
    worker = start_worker(name='knn', queues=('es2_knn',), concurrency=1)
    client = api_as(make_user(is_staff=True))
    configure(es2_knn=5)  # pool 4
    wait_until(lambda: pool_of(worker.node) == 4, timeout=15, interval=0.3, message='the pool to grow to 4')
    busy = [submit_long(client, tiny_source) for _ in range(4)]
    pids = [running_pid(call_id) for call_id in busy]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        configure(es2_knn=2)  # pool 1, every process busy
        time.sleep(3)  # the config cache (1 s) and a few reconcile intervals (0.5 s)
        waiting = [submit(client, tiny_source).json()['id'] for _ in range(3)]
        time.sleep(1)
        assert Work.objects.filter(pk__in=waiting, state='queued').count() == 3
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    for call_id in busy + waiting:
        assert poll(client, call_id, timeout=90).json()['state'] == 'succeeded'
    works = list(Work.objects.filter(pk__in=busy + waiting))
    for late in [work for work in works if work.pk in waiting]:
        running = [work.pk for work in works if work.started_at <= late.started_at < work.finished_at]
        assert running == [late.pk], (late.pk, running)  # it ran alone
    wait_until(lambda: pool_of(worker.node) == 1, timeout=30, interval=0.3, message='the pool to shrink to 1')


def test_a_grown_pool_forks_its_new_processes_at_once(start_worker, configure):
    """billiard forks a grown pool's processes at its next maintenance (every 5 s): the reconciler's own
    grow (workers.pool.grow_now) forks them as it grows, so a lane grown to three runs three calls now."""
    import subprocess

    from capacity.config import get_current
    from workers.status import get_queues
    worker = start_worker(name='knn', queues=('es2_knn',), concurrency=1)
    configure(es2_knn=4)  # pool 3

    def published():  # what the node's reconciler says its pool is, as soon as it resized it
        return get_queues(get_current()[1])['es2_knn']['workers'].get(worker.node, {}).get('processes')
    wait_until(lambda: published() == 3, timeout=15, interval=0.05, message='the pool to grow to 3')

    def children():
        return subprocess.run(['pgrep', '-P', str(worker.process.pid)], capture_output=True, text=True).stdout
    # Within a second, not at billiard's next maintenance (5 s): the grow and its forks are one command.
    wait_until(lambda: len(children().split()) == 3, timeout=1.5, interval=0.05, message='three processes')
