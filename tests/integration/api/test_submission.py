"""Submitting heavy calls over HTTP: idempotency, waiting in the request, the waiting room, a broken
broker, and the order of the capacity gate, rate limits and metering."""
import contextlib
import json
import threading
import time

import pytest

from api.throttles import HeavyRateThrottle
from capacity.constants import Lane
from capacity.keys import lane_key, rate_key
from tests.integration.calls import distinct
from tests.integration.workers.conftest import wait_until
from workers.models import Call, Work

pytestmark = pytest.mark.redis
AWARE = {'HTTP_X_OCL_EVENT_METADATA': json.dumps({'capacity_aware': 'true'})}
ROWS = [{'name': 'high blood pressure'}, {'name': 'heart attack'}]
MANY = {'staff': 50, 'core': 50, 'early_access': 50, 'preview': 50}


def match(client, source, rows=ROWS, query='semantic=true', same=False, **headers):
    """A polling client's submission (a handle at once): Prefer: respond-async unless the test says. A
    work of its own unless `same` (identical calls share one run)."""
    headers.setdefault('HTTP_PREFER', 'respond-async')
    rows = rows if same else distinct(rows)
    return client.post(f'/concepts/$match/?{query}', {'rows': rows, 'target_repo_url': source}, format='json',
                       **headers)


def rate_limit_count(redis_client, user):
    """The requests of `user` counted in the heavy rate limit's window (api.throttles)."""
    return redis_client.zcard(rate_key('heavy', user.pk))


def user_leases(redis_client, user):
    return redis_client.zcard(lane_key(Lane.USER, user.pk))


def test_the_same_idempotency_key_and_payload_return_the_same_handle_and_take_no_second_lease(
        broker, lanes_redis, tiny_source, make_user, api_as):
    user = make_user('core_user')
    client = api_as(user)
    first = match(client, tiny_source, same=True, HTTP_IDEMPOTENCY_KEY='run-1-batch-1')
    again = match(client, tiny_source, same=True, HTTP_IDEMPOTENCY_KEY='run-1-batch-1')
    assert first.status_code == again.status_code == 202
    assert first.json()['id'] == again.json()['id']
    assert user_leases(lanes_redis, user) == 1
    assert Call.objects.filter(owner=user).count() == 1  # one call row: one charge


def test_the_same_idempotency_key_with_another_payload_is_a_422(broker, lanes_redis, tiny_source, make_user, api_as):
    client = api_as(make_user())
    assert match(client, tiny_source, HTTP_IDEMPOTENCY_KEY='k').status_code == 202
    response = match(client, tiny_source, rows=[{'name': 'fever'}], HTTP_IDEMPOTENCY_KEY='k')
    assert response.status_code == 422
    assert response.json()['error_code'] == 'idempotency_conflict'
    assert 'Idempotency-Key "k"' in response.json()['detail']


def test_another_users_idempotency_key_is_theirs_alone(broker, lanes_redis, tiny_source, make_user, api_as):
    one, two = api_as(make_user()), api_as(make_user())
    assert match(one, tiny_source, HTTP_IDEMPOTENCY_KEY='k').json()['id'] != \
        match(two, tiny_source, HTTP_IDEMPOTENCY_KEY='k').json()['id']


def idempotency_claim(user, key):
    from workers.idempotency import key_claim
    return key_claim(user.pk, key)


def test_a_new_idempotency_key_is_answered_without_looking_for_an_earlier_call(
        broker, lanes_redis, tiny_source, make_user, api_as):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    user = make_user()
    client = api_as(user)
    with CaptureQueriesContext(connection) as queries:
        assert match(client, tiny_source, HTTP_IDEMPOTENCY_KEY='fresh').status_code == 202
    lookups = [q['sql'] for q in queries.captured_queries
               if q['sql'].lstrip().upper().startswith('SELECT') and 'idempotency_key' in q['sql']]
    assert lookups == []
    # The recorded call keeps its key claimed, so a resend finds it (the claim of a request lasts 10 s).
    assert lanes_redis.ttl(idempotency_claim(user, 'fresh')) > 3600


def test_a_kept_idempotency_claim_takes_about_120_bytes_of_redis_for_its_day(
        broker, lanes_redis, tiny_source, make_user, api_as, key_prefix):
    """Kept a day, a claim a call is Redis's largest per-call cost (docs/deployment.md, "Scaling on paper");
    with a 64-character digest and the call's id in it, it was 200 bytes under a 12-character prefix."""
    user = make_user()
    key = 'mapper-run-7:row-0012:attempt-1'
    assert match(api_as(user), tiny_source, HTTP_IDEMPOTENCY_KEY=key).status_code == 202
    [claim] = list(lanes_redis.scan_iter(match=f'{key_prefix}:claim:idempotency:*', count=1000))
    assert lanes_redis.ttl(claim) > 3600
    used = lanes_redis.memory_usage(claim)
    assert used <= 128, (claim, used)  # 120 B on Redis 7.0 (jemalloc rounds each part up)


def test_a_resend_whose_claim_redis_lost_is_still_answered_with_its_first_call(
        broker, lanes_redis, tiny_source, make_user, api_as):
    user = make_user('core_user')
    client = api_as(user)
    first = match(client, tiny_source, same=True, HTTP_IDEMPOTENCY_KEY='lost')
    assert first.status_code == 202
    lanes_redis.delete(idempotency_claim(user, 'lost'))  # as a flush or a failover would
    again = match(client, tiny_source, same=True, HTTP_IDEMPOTENCY_KEY='lost')
    assert again.status_code == 202
    assert again.json()['id'] == first.json()['id']
    lanes_redis.delete(idempotency_claim(user, 'lost'))
    other = match(client, tiny_source, rows=[{'name': 'fever'}], HTTP_IDEMPOTENCY_KEY='lost')
    assert other.status_code == 422
    assert other.json()['error_code'] == 'idempotency_conflict'
    assert Call.objects.filter(owner=user).count() == 1
    assert user_leases(lanes_redis, user) == 1  # what the resends took was given back


def test_racing_requests_with_one_idempotency_key_get_one_call(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(per_user=MANY, tiers=MANY, es2_knn=50, api_heavy={'cluster': 50, 'per_task': 50})
    user = make_user('core_user')
    answers, barrier = [], threading.Barrier(6)

    def post():
        from django.db import connection
        barrier.wait()
        try:
            answers.append(match(api_as(user), tiny_source, same=True, HTTP_IDEMPOTENCY_KEY='race'))
        finally:
            connection.close()
    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(response.status_code for response in answers) == [202] * 6
    assert len({response.json()['id'] for response in answers}) == 1
    assert Call.objects.filter(owner=user).count() == 1
    assert user_leases(lanes_redis, user) == 1
    from workers.status import depth
    assert depth('es2_knn') == 1
    # Only the request that made the call was gated and rate-limited; the others were answered with it.
    assert sum('X-OCL-Capacity-Decision' in response for response in answers) == 1
    assert rate_limit_count(lanes_redis, user) == 1


def test_an_unreachable_broker_is_a_503_that_leaves_nothing_behind(
        lanes_redis, tiny_source, make_user, api_as, monkeypatch):
    from celery import Celery

    from workers import lifecycle
    from workers.celery import app
    # The same publish, through a Celery app whose broker address has nothing listening (discard port).
    # (Celery lets the CELERY_BROKER_URL environment variable win over any configured URL.)
    monkeypatch.delenv('CELERY_BROKER_URL')
    dead = Celery('unreachable', broker='redis://127.0.0.1:9/0', set_as_current=False)
    dead.conf.update(task_publish_retry_policy=app.conf.task_publish_retry_policy,
                     broker_transport_options=app.conf.broker_transport_options)
    monkeypatch.setattr(lifecycle.create, 'send', lambda work, **options: dead.send_task(
        'heavy_lanes.run_heavy_call', args=[work.pk], task_id=work.pk, queue=work.queue))
    user = make_user()
    response = match(api_as(user), tiny_source)
    assert response.status_code == 503
    assert response.json()['error_code'] == 'queue_unavailable'
    assert 'nothing was submitted' in response.json()['detail']
    assert Call.objects.count() == 0  # the row written before the publish was deleted again
    assert user_leases(lanes_redis, user) == 0


def test_enforce_lets_the_waiting_room_fill_then_refuses(broker, lanes_redis, tiny_source, make_user, api_as,
                                                         configure):
    configure(mode='enforce', enforce_for='all', es2_knn=2, per_user=MANY, tiers=MANY,
              queue={'deadline_seconds': 600, 'max_waiting': {'interactive': 0, 'es2_knn': 1, 'api_heavy': 0}})
    client = api_as(make_user('core_user'))
    codes = [match(client, tiny_source).status_code for _ in range(3)]
    assert codes == [202, 202, 429]


def test_a_capacity_refusal_costs_no_rate_limit_allowance_and_no_usage(
        broker, lanes_redis, tiny_source, make_user, api_as, configure, monkeypatch):
    monkeypatch.setitem(HeavyRateThrottle.THROTTLE_RATES, 'heavy', '2/min')
    configure(mode='enforce', enforce_for='all', per_user={**MANY, 'preview': 0})
    user = make_user()
    client = api_as(user)
    refusals = [match(client, tiny_source) for _ in range(3)]
    assert [r.status_code for r in refusals] == [429] * 3
    assert {r.json()['error_code'] for r in refusals} == {'capacity_exceeded'}
    configure(per_user=MANY, tiers=MANY, es2_knn=50, api_heavy={'cluster': 50, 'per_task': 50})
    answers = [match(client, tiny_source) for _ in range(3)]
    assert [r.status_code for r in answers] == [202, 202, 429]
    limited = answers[2].json()
    assert limited['error_code'] == 'rate_limited' and limited['retry_after'] >= 1
    assert 'scope' not in limited
    assert Call.objects.filter(owner=user).count() == 2  # the refused calls left no row (no usage)
    assert user_leases(lanes_redis, user) == 2  # the rate-limited call took no lease either
    assert rate_limit_count(lanes_redis, user) == 2  # and the capacity refusals no allowance


def test_prefer_wait_holds_this_hosts_lane_while_it_waits_then_answers_with_the_handle(
        broker, lanes_redis, tiny_source, make_user, api_as, configure, settings):
    settings.CAPACITY_TASK_ID = 'api-1'
    user = make_user()
    client = api_as(user)
    seen = {}
    task_key = lane_key(Lane.API_HEAVY_TASK, 'api-1')

    def watch():
        wait_until(lambda: lanes_redis.zcard(task_key) == 1, timeout=5, interval=0.01, message='the host lane')
        seen['held'] = True
    watcher = threading.Thread(target=watch)
    watcher.start()
    response = match(client, tiny_source, HTTP_PREFER='wait=1')
    watcher.join(6)
    assert seen.get('held')
    assert response.status_code == 202  # no worker runs: the wait ran out
    assert lanes_redis.zcard(task_key) == 0
    work = Work.objects.get(pk=response.json()['id'])
    assert task_key not in work.lease['keys']
    assert user_leases(lanes_redis, user) == 1  # the call itself still holds its lanes


def test_respond_async_and_capacity_aware_clients_never_wait(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(wait={'default_seconds': 5, 'max_seconds': 30})
    client = api_as(make_user('core_user'))
    import time
    started = time.monotonic()
    assert match(client, tiny_source, HTTP_PREFER='respond-async').status_code == 202
    assert match(client, tiny_source, **AWARE).status_code == 202
    assert time.monotonic() - started < 2


@pytest.mark.slow
def test_prefer_wait_answers_200_with_the_result_when_it_finishes_in_time(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis):
    client = api_as(make_user())
    response = match(client, tiny_source, HTTP_PREFER='wait=20')
    assert response.status_code == 200, response.content
    assert response['Preference-Applied'] == 'wait=20'
    # The body the in-request endpoint gives, and where the task is: the same body as its result.
    task = client.get(response['Content-Location']).json()
    assert task['state'] == 'succeeded' and task['result'] == response.json()
    assert lanes_redis.zcard(lane_key(Lane.API_HEAVY_TASK, 'test-host')) == 0


def test_a_waiting_request_is_answered_from_its_calls_end_notice_without_reading_it_again(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis, monkeypatch):
    """The worker announces a success with its result and its count; the request that waits for it, watching
    since before the call was published, answers from that notice: no look at the row, no read of the result
    or of its count."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workers import notify
    from workers.lifecycle import reads
    hub = notify.get_hub()
    hub.unwatch(hub.watch('warm-up'))  # the hub subscribes: the request's watch begins connected
    assert hub.connected.wait(5)
    looks, results = [], []
    real_stored_result = reads.stored_result
    monkeypatch.setattr(reads, 'stored_result', lambda call_id: results.append(call_id) or real_stored_result(call_id))
    real_wait_for = notify.wait_for

    def counting_wait_for(call_id, is_finished, *args, **kwargs):
        return real_wait_for(call_id, lambda: looks.append(call_id) or is_finished(), *args, **kwargs)
    monkeypatch.setattr(notify, 'wait_for', counting_wait_for)
    client = api_as(make_user())
    started = time.monotonic()
    with CaptureQueriesContext(connection) as queries:
        response = match(client, tiny_source, HTTP_PREFER='wait=20')
    assert response.status_code == 200, response.content
    assert time.monotonic() - started < notify.POLL_SECONDS  # not found by a periodic look
    assert looks == [] and results == []
    assert not [query for query in queries if query['sql'].startswith('SELECT') and 'answer_count' in query['sql']]
    task = client.get(response['Content-Location']).json()
    assert task['state'] == 'succeeded' and task['result'] == response.json()
    assert int(response['num_returned']) == sum(len(entry['results']) for entry in response.json())


def test_a_waited_calls_end_goes_to_its_own_api_process_only(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis):
    """With two API processes, the end of a call one of them waits for reaches that one alone: the other's
    subscriber hears nothing of it (before, every process heard every result). `other` is the second
    process's hub: its own subscriber connection and its own channel, as in another gunicorn worker."""
    from workers import notify
    hub, other = notify.get_hub(), notify.Hub()
    heard = []
    real_wake = other.wake
    other.wake = lambda call_id, notice=None: heard.append((call_id, notice)) or real_wake(call_id, notice)
    other.start()
    try:
        hub.unwatch(hub.watch('warm-up'))  # the hub subscribes: the request's watch begins connected
        assert hub.connected.wait(5) and other.connected.wait(5)
        response = match(api_as(make_user()), tiny_source, HTTP_PREFER='wait=20')
        assert response.status_code == 200, response.content
        call_id = response['Content-Location'].rstrip('/').rsplit('/', 1)[-1]
        # Redis delivers one subscriber's messages in the order it took the PUBLISHes: once a notice
        # published after the end's is heard, the end's would have been.
        notify.publish('marker', 'queued')
        wait_until(lambda: any(name == 'marker' for name, _ in heard), timeout=5, message='the marker notice')
    finally:
        other.stop()
    assert [name for name, _ in heard if name == call_id] == []


@pytest.mark.slow
def test_respond_async_with_wait_answers_the_result_of_a_call_that_ends_in_time(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis):
    client = api_as(make_user())
    response = match(client, tiny_source, HTTP_PREFER='respond-async, wait=20')
    assert response.status_code == 200, response.content
    assert response['Preference-Applied'] == 'respond-async, wait=20'
    task = client.get(response['Content-Location']).json()
    assert task['state'] == 'succeeded' and task['result'] == response.json()


def test_respond_async_with_wait_answers_the_handle_when_the_wait_runs_out(
        broker, lanes_redis, tiny_source, make_user, api_as):
    started = time.monotonic()
    handle = match(api_as(make_user()), tiny_source, HTTP_PREFER='respond-async, wait=1')  # no worker runs
    assert handle.status_code == 202 and handle['Preference-Applied'] == 'respond-async'
    assert 0.9 < time.monotonic() - started < 5


@pytest.mark.slow
def test_a_request_without_respond_async_waits_by_default_also_when_capacity_aware(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis):
    aware = json.dumps({'capacity_aware': 'true'})
    client = api_as(make_user())
    for headers in ({'HTTP_PREFER': ''}, {'HTTP_PREFER': '', 'HTTP_X_OCL_EVENT_METADATA': aware}):
        response = match(client, tiny_source, **headers)
        assert response.status_code == 200, response.content
        assert 'Preference-Applied' not in response and response['Content-Location'].startswith('/tasks/')
    handle = match(client, tiny_source, HTTP_PREFER='respond-async')
    assert handle.status_code == 202 and handle['Preference-Applied'] == 'respond-async'


@pytest.mark.slow
def test_a_bad_body_the_worker_finds_is_the_in_request_400_naming_the_field(
        start_worker, tiny_source, make_user, api_as, lanes_redis, configure):
    from concepts.models import Source
    configure(es2_knn=1)  # paused, so the source can go away before the call runs
    start_worker()
    client = api_as(make_user())
    waiting = {}
    thread = threading.Thread(target=lambda: waiting.setdefault('response', match(client, tiny_source,
                                                                                HTTP_PREFER='wait=30')))
    thread.start()
    wait_until(lambda: Call.objects.exists(), timeout=10, message='the call to be queued')
    Source.objects.all().delete()
    configure(es2_knn=3)
    thread.join(40)
    response = waiting['response']
    assert response.status_code == 400, response.content
    assert response.json()['error_code'] == 'invalid' and 'target_repo_url' in response.json()['detail']


@pytest.mark.slow
def test_a_call_that_fails_is_refunded(start_worker, tiny_source, make_user, api_as, lanes_redis, configure):
    from concepts.models import Source
    configure(es2_knn=1)  # paused, so the source can go away before the call runs
    start_worker()
    user = make_user()
    client = api_as(user)
    call_id = match(client, tiny_source).json()['id']
    Source.objects.all().delete()
    configure(es2_knn=3)
    task = wait_until(lambda: (lambda b: b if b['state'] not in ('queued', 'running') else None)(
        client.get(f'/tasks/{call_id}/').json()), timeout=30, message='the call to end')
    assert task['state'] == 'failed' and task['error']
    assert Work.objects.get(pk=call_id).state == 'failed'  # its usage is given back: a failed call is free


def test_long_polls_share_this_hosts_waiting_slots_and_answer_at_once_when_they_are_taken(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    import time
    configure(api_heavy={'cluster': 4, 'per_task': 2})  # a bulk call's waits: 2 - the reserve of 1
    client = api_as(make_user())
    call_id = match(client, tiny_source).json()['id']  # queued; no worker runs
    holder = threading.Thread(target=lambda: client.get(f'/tasks/{call_id}/?wait=3'))
    holder.start()
    wait_until(lambda: lanes_redis.zcard(lane_key(Lane.API_HEAVY_TASK, 'test-host')) == 1, timeout=5,
               interval=0.01, message='the first long poll to take the slot')
    started = time.monotonic()
    second = client.get(f'/tasks/{call_id}/?wait=3')
    assert time.monotonic() - started < 1  # the slot is taken: no second worker is held
    assert second.status_code == 200 and second.json()['state'] == 'queued'
    holder.join(10)
    assert lanes_redis.zcard(lane_key(Lane.API_HEAVY_TASK, 'test-host')) == 0  # released after


def test_a_single_row_calls_long_poll_waits_on_a_host_whose_bulk_waits_are_full(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    import time
    configure(api_heavy={'cluster': 4, 'per_task': 2})  # bulk waits: 1; the reserve: 1
    client = api_as(make_user())
    bulk_id = match(client, tiny_source).json()['id']  # queued; no worker runs
    single_id = match(client, tiny_source, rows=[{'name': 'chest pain'}]).json()['id']
    holder = threading.Thread(target=lambda: client.get(f'/tasks/{bulk_id}/?wait=3'))
    holder.start()
    slots = lane_key(Lane.API_HEAVY_TASK, 'test-host')
    wait_until(lambda: lanes_redis.zcard(slots) == 1, timeout=5, interval=0.01,
               message="the bulk call's long poll to take the bulk share")
    assert client.get(f'/tasks/{bulk_id}/?wait=3').json()['state'] == 'queued'  # no bulk wait is left
    started = time.monotonic()
    single = client.get(f'/tasks/{single_id}/?wait=1')
    assert time.monotonic() - started >= 0.9  # it waited, in the reserve
    assert single.status_code == 200 and single.json()['state'] == 'queued'
    holder.join(10)
    assert lanes_redis.zcard(slots) == 0


@contextlib.contextmanager
def read_only_database():
    """This process's database connection refuses writes (SQLite's query_only), as a full disk would."""
    from django.db import connection
    with connection.cursor() as cursor:
        cursor.execute('PRAGMA query_only = ON')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute('PRAGMA query_only = OFF')


def test_a_database_that_refuses_writes_is_a_503_that_says_so_and_leaves_no_lease(
        broker, lanes_redis, tiny_source, make_user, api_as):
    user = make_user()
    client = api_as(user)
    with read_only_database():
        response = match(client, tiny_source)
    assert response.status_code == 503, response.content
    assert response.json()['error_code'] == 'database_unavailable' and 'database' in response.json()['detail']
    assert response['Retry-After']
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0
    assert not Call.objects.exists()


def test_a_config_change_the_database_refuses_is_a_503(make_user, api_as, transactional_db):
    from capacity.models import CapacityConfig
    client = api_as(make_user(is_staff=True))
    with read_only_database():
        response = client.patch('/capacity/config/', {'es2_knn': 5}, format='json')
    assert response.status_code == 503 and response.json()['error_code'] == 'database_unavailable'
    assert not CapacityConfig.objects.exists()


def test_a_stored_answer_is_written_as_it_is_stored_and_its_count_comes_with_it(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis):
    """The answer and the task's result are the stored JSON text, verbatim (api.renderers): a read holds the
    text and its bytes, not its parsed objects and a rendering of them. The count was stored with it."""
    from workers.lifecycle import stored_result
    client = api_as(make_user())
    response = match(client, tiny_source, HTTP_PREFER='wait=20')
    assert response.status_code == 200, response.content
    call = Call.objects.select_related('work').get(pk=response['Content-Location'].split('/')[-2])
    text = stored_result(call.work_id)
    assert response.content == text.encode()
    assert int(response['num_returned']) == call.work.answer_count == sum(
        len(entry['results']) for entry in json.loads(text)) > 0
    task = client.get(response['Content-Location'])
    assert task.content.endswith(b',"result":' + text.encode() + b'}')
    assert task.json()['result'] == json.loads(text) and task.json()['state'] == 'succeeded'


def test_a_long_stored_answer_is_streamed_from_the_database_in_slices(
        in_process_worker, tiny_source, make_user, api_as, lanes_redis, settings, django_assert_max_num_queries):
    """Longer than a slice, the answer and the task's result are sent a slice at a time (the task's read
    from the database as it is sent): the same bytes as stored, never the whole text in the API process."""
    from workers.lifecycle import stored_result
    settings.RESULT_SLICE_CHARACTERS = 64
    client = api_as(make_user())
    response = match(client, tiny_source, HTTP_PREFER='wait=20')
    assert response.status_code == 200 and response.streaming
    body = b''.join(response.streaming_content)
    call_id = response['Content-Location'].split('/')[-2]
    text = stored_result(Call.objects.get(pk=call_id).work_id)
    assert body == text.encode() and len(text) > 64 * 3
    assert int(response['num_returned']) == sum(len(entry['results']) for entry in json.loads(text))
    task = client.get(response['Content-Location'])
    assert task.streaming and 'Content-Length' not in task and task['Content-Type'] == 'application/json'
    with django_assert_max_num_queries(len(text) // 64 + 2):  # one a slice
        body = b''.join(task.streaming_content)
    assert body.endswith(b',"result":' + text.encode() + b'}') and json.loads(body)['state'] == 'succeeded'
