"""GET /tasks/ (the caller's calls, filtered and paged), DELETE /tasks/?run= (a client's run cancelled at
once) and POST /tasks/<id>/retry/ (a failed call sent again), over HTTP against the real Redis broker and
lanes, with real worker processes where calls must run."""
import json
from urllib.parse import urlencode

import pytest

from tests.integration.calls import distinct
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS, holds, poll, released, running_pid
from workers.models import Call, Work

pytestmark = pytest.mark.redis
ROWS = [{'name': 'high blood pressure'}, {'name': 'sugar diabetes'}]


def run_header(run):
    return {'HTTP_X_OCL_EVENT_METADATA': json.dumps({'automatch_run_id': run})} if run else {}


def match(client, source, run=None, rows=ROWS):
    response = client.post('/concepts/$match/?semantic=true', {'rows': distinct(rows), 'target_repo_url': source},
                           format='json', HTTP_PREFER='respond-async', **run_header(run))
    assert response.status_code == 202, response.content
    return response.json()['id']


def rerank(client, run=None):
    response = client.post('/concepts/$rerank/', {'q': 'fever', 'rows': distinct([{'name': 'fever'}])},
                           format='json', HTTP_PREFER='respond-async', **run_header(run))
    assert response.status_code == 202, response.content
    return response.json()['id']


def ids(response):
    assert response.status_code == 200, response.content
    return [entry['id'] for entry in response.json()['results']]


def bad(response, parameter):
    """A 400 whose body names `parameter`."""
    assert response.status_code == 400, response.content
    assert parameter in response.json()['detail'], response.json()
    return response


def test_the_list_shows_the_callers_calls_newest_first_filtered_and_in_pages(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(es2_knn=1)  # es2_knn paused: every $match waits in its queue
    owner, other = make_user(), make_user()
    staff = make_user(is_staff=True)
    client = api_as(owner)
    first = [match(client, tiny_source, run='run-a') for _ in range(3)]
    reranked = rerank(client, run='run-b')
    plain = match(client, tiny_source)
    others = match(api_as(other), tiny_source, run='run-a')
    assert client.delete(f'/tasks/{first[0]}/').json()['state'] == 'cancelled'
    mine = [plain, reranked, *reversed(first)]  # newest first

    listed = client.get('/tasks/')
    assert ids(listed) == mine and listed.json()['count'] == 5
    assert (listed.json()['next'], listed.json()['previous']) == (None, None)
    # Each entry is the call's own handle body, without the result (read at its url).
    entry = listed.json()['results'][-1]
    one = client.get(f'/tasks/{first[1]}/').json()
    assert listed.json()['results'][-2].keys() == one.keys() and listed.json()['results'][-2]['id'] == one['id']
    assert (entry['state'], entry['url'], entry['endpoint']) == ('cancelled', f'/tasks/{first[0]}/', '$match')
    assert listed.json()['results'][0]['position'] >= 1

    assert ids(client.get('/tasks/?run=run-a')) == list(reversed(first))
    assert ids(client.get('/tasks/?run=run-a&state=queued')) == [first[2], first[1]]
    assert ids(client.get('/tasks/?state=cancelled')) == [first[0]]
    assert ids(client.get('/tasks/?state=queued,cancelled&endpoint=$match')) == [plain, *reversed(first)]
    assert ids(client.get('/tasks/', {'endpoint': '$rerank'})) == [reranked]
    assert ids(client.get('/tasks/?state=succeeded')) == []

    pages = [client.get('/tasks/?page_size=2'), client.get('/tasks/?page_size=2&page=2'),
             client.get('/tasks/?page_size=2&page=3')]
    assert [ids(page) for page in pages] == [mine[:2], mine[2:4], mine[4:]]
    assert pages[0].json()['count'] == 5 and pages[0].json()['previous'] is None
    assert pages[0].json()['next'].endswith('/tasks/?page=2&page_size=2')
    assert pages[2].json()['next'] is None and pages[2].json()['previous'].endswith('page=2&page_size=2')

    # Another user sees only their own; staff see everyone's, or one user's.
    assert ids(api_as(other).get('/tasks/')) == [others]
    assert api_as(other).get(f'/tasks/?user={owner.username}').status_code == 403
    assert api_as(staff).get('/tasks/').json()['count'] == 6
    assert ids(api_as(staff).get(f'/tasks/?user={owner.username}&run=run-a')) == list(reversed(first))
    assert ids(api_as(staff).get('/tasks/?run=run-a&state=queued')) == [others, first[2], first[1]]

    # Bad filters are 400s naming them; nobody unauthenticated lists anything.
    bad(client.get('/tasks/?state=done'), 'state')
    bad(client.get('/tasks/?state=queued,,bogus'), 'state')
    bad(client.get('/tasks/?endpoint=$lookup'), 'endpoint')
    bad(client.get('/tasks/?run=' + 'r' * 256), 'run')
    bad(client.get('/tasks/?run=a%00b'), 'run')
    bad(client.get('/tasks/?page=0'), 'page')
    bad(client.get('/tasks/?page=9'), 'page')
    bad(client.get('/tasks/?page_size=101'), 'page_size')
    bad(api_as(staff).get('/tasks/?user=nobody-at-all'), 'user')
    bad(client.delete('/tasks/'), 'run')
    assert api_as(make_user()).get('/tasks/').json()['count'] == 0
    from rest_framework.test import APIClient
    assert APIClient().get('/tasks/').status_code == 401


def test_a_long_run_id_finds_and_cancels_exactly_the_calls_sent_with_it(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(es2_knn=1)  # es2_knn paused: every $match waits in its queue
    client = api_as(make_user())
    run = 'mapper-2026-12-05T08:39:21.512Z-7f3a'  # OCL's Mapper's ids are longer than 20 characters
    sibling = run[:20] + '-other-run'           # another run, the same first 20 characters
    mine = [match(client, tiny_source, run=run) for _ in range(2)]
    theirs = match(client, tiny_source, run=sibling)
    short = match(client, tiny_source, run=run[:20])
    longest = match(client, tiny_source, run='r' * 255)

    assert ids(client.get('/tasks/', {'run': run})) == list(reversed(mine))
    assert ids(client.get('/tasks/', {'run': sibling})) == [theirs]
    assert ids(client.get('/tasks/', {'run': run[:20]})) == [short]
    assert ids(client.get('/tasks/', {'run': 'r' * 255})) == [longest]
    assert Call.objects.get(pk=mine[0]).run_id == run

    response = client.delete('/tasks/?' + urlencode({'run': run}))
    assert response.status_code == 200 and response.json() == {'cancelled': 2}
    assert [client.get(f'/tasks/{call_id}/').json()['state'] for call_id in (*mine, theirs, short)] == [
        'cancelled', 'cancelled', 'queued', 'queued']

    # A longer id than the API keeps is refused where it is sent, naming it, before anything is counted.
    refused = client.post('/concepts/$match/?semantic=true',
                          {'rows': distinct(ROWS), 'target_repo_url': tiny_source}, format='json',
                          HTTP_PREFER='respond-async', **run_header('r' * 256))
    bad(refused, 'automatch_run_id')
    assert Call.objects.count() == 5


def test_page_links_name_only_a_host_the_service_answers_to(
        broker, lanes_redis, tiny_source, make_user, api_as, configure, settings):
    from api.settings import LOOPBACK_HOSTS
    configure(es2_knn=1)
    client = api_as(make_user())
    for _ in range(2):
        match(client, tiny_source)
    settings.ALLOWED_HOSTS = LOOPBACK_HOSTS.split(',')  # what make run serves, without the test client's name
    forged = client.get('/tasks/?page_size=1', HTTP_HOST='evil.example')
    assert forged.status_code == 400 and forged.json()['error_code'] == 'bad_request'
    for host in ('127.0.0.1:8000', 'localhost:8000'):
        page = client.get('/tasks/?page_size=1', HTTP_HOST=host)
        assert page.status_code == 200 and page.json()['next'] == f'http://{host}/tasks/?page=2&page_size=1'


@pytest.mark.slow
def test_cancelling_a_run_cancels_its_open_calls_only_and_releases_their_leases(
        start_worker, tiny_source, make_user, api_as, lanes_redis, configure):
    configure(es2_knn=2)  # one bulk es2_knn process: the run's first call runs, the others wait behind it
    start_worker(queues=['es2_knn'])
    owner, other = make_user(), make_user()
    client = api_as(owner)
    running = client.post('/concepts/$match/?semantic=true&reranker=true',
                          {'rows': distinct(LONG_ROWS), 'target_repo_url': tiny_source, 'limit': 100},
                          format='json', HTTP_PREFER='respond-async', **run_header('run-a')).json()['id']
    running_pid(running)
    queued = [match(client, tiny_source, run='run-a') for _ in range(2)]
    kept = [match(client, tiny_source, run='run-b'), match(api_as(other), tiny_source, run='run-a')]
    assert all(holds(lanes_redis, call_id) > 0 for call_id in [running, *queued, *kept])

    response = client.delete('/tasks/?run=run-a')
    assert response.status_code == 200 and response.json() == {'cancelled': 3}
    for call_id in [running, *queued]:
        assert client.get(f'/tasks/{call_id}/').json()['state'] == 'cancelled'
    released(lambda: all(holds(lanes_redis, call_id) == 0 for call_id in queued))
    wait_until(lambda: holds(lanes_redis, running) == 0, timeout=10, message='the running call\'s leases')
    # The other run and the other user's call of the same run go on, and run to their end.
    assert poll(client, kept[0], timeout=60).json()['state'] == 'succeeded'
    assert poll(api_as(other), kept[1], timeout=60).json()['state'] == 'succeeded'
    # Nothing of the cancelled run ran after the cancel, and a second cancel finds nothing open.
    assert [Work.objects.get(pk=call_id).attempts for call_id in queued] == [0, 0]
    assert Work.objects.get(pk=running).state == 'cancelled'
    assert client.delete('/tasks/?run=run-a').json() == {'cancelled': 0}


def test_cancelling_a_large_run_takes_a_few_statements_whatever_its_size_and_leaves_shared_work_to_others(
        broker, lanes_redis, tiny_source, make_user, api_as, configure, each_database):
    """A run of 899 calls held its DELETE for 52.8 s: a transaction, a queue scan and a revoke a call."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workers import messages
    configure(es2_knn=1)  # es2_knn paused: every call waits in its queue
    client = api_as(make_user())
    run = [match(client, tiny_source, run='run-big') for _ in range(40)]
    shared_rows = distinct(ROWS)
    body = {'rows': shared_rows, 'target_repo_url': tiny_source}
    shared = client.post('/concepts/$match/?semantic=true', body, format='json', HTTP_PREFER='respond-async',
                         **run_header('run-big')).json()['id']
    joined = client.post('/concepts/$match/?semantic=true', body, format='json', HTTP_PREFER='respond-async',
                         **run_header('run-small')).json()['id']
    work = Call.objects.get(pk=joined).work_id
    assert work == Call.objects.get(pk=shared).work_id and messages.depth('es2_knn') == 41

    with CaptureQueriesContext(connection) as queries:
        response = client.delete('/tasks/?run=run-big')
    assert response.status_code == 200 and response.json() == {'cancelled': 41}
    assert len(queries) <= 15, [query['sql'][:120] for query in queries]  # it was 6 a call
    assert ids(client.get('/tasks/?run=run-big&state=cancelled&page_size=100')) == [shared, *reversed(run)]
    assert all(holds(lanes_redis, call_id) == 0 for call_id in run)
    assert [Work.objects.get(pk=call_id).state for call_id in run] == ['cancelled'] * 40
    # The work a call of another run shares goes on for it, leases, message and all.
    assert client.get(f'/tasks/{joined}/').json()['state'] == 'queued'
    assert Work.objects.get(pk=work).holders == 1 and holds(lanes_redis, work) > 0
    assert messages.depth('es2_knn') == 1


@pytest.mark.slow
def test_a_failed_call_is_sent_again_as_a_new_call_of_the_same_run(
        start_worker, tiny_source, make_user, api_as, lanes_redis, configure):
    from concepts.loader import load_terminology
    from concepts.models import Source
    from concepts.services import forget_sources
    from concepts.terminology import read_tiny
    configure(es2_knn=1)  # paused, so the source can go away before the call runs: it fails
    start_worker()
    owner = make_user()
    client = api_as(owner)
    failed = match(client, tiny_source, run='run-f')
    Source.objects.all().delete()
    configure(es2_knn=3)
    assert poll(client, failed, timeout=60).json()['state'] == 'failed'
    assert api_as(make_user()).post(f'/tasks/{failed}/retry/').status_code == 404
    assert client.post('/tasks/nonesuch/retry/').status_code == 404
    # While the source is still gone the retry is the endpoint's 400, before anything is counted.
    assert bad(client.post(f'/tasks/{failed}/retry/'), 'target_repo_url')

    load_terminology(read_tiny())
    forget_sources()
    response = client.post(f'/tasks/{failed}/retry/', HTTP_PREFER='respond-async')
    assert response.status_code == 202, response.content
    again = response.json()['id']
    assert again != failed and response['Location'] == f'/tasks/{again}/'
    assert response['X-OCL-Capacity-Decision'] == 'admitted'
    new, old = Call.objects.get(pk=again), Call.objects.get(pk=failed)
    assert (new.endpoint, new.work.payload, new.run_id) == (old.endpoint, old.work.payload, 'run-f')
    task = poll(client, again, timeout=60).json()
    assert task['state'] == 'succeeded', task
    assert [entry['row']['name'] for entry in task['result']] == [row['name'] for row in ROWS]
    assert client.get(f'/tasks/{failed}/').json()['state'] == 'failed'  # the failed call stays as it was
    assert ids(client.get('/tasks/?run=run-f')) == [again, failed]
    conflict = client.post(f'/tasks/{again}/retry/')
    assert conflict.status_code == 409 and 'succeeded' in conflict.json()['detail']


def test_a_retry_is_refused_by_capacity_as_a_submission_is_and_admitted_once_there_is_room(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    client = api_as(make_user())
    cancelled = match(client, tiny_source, run='run-x')
    assert client.delete(f'/tasks/{cancelled}/').json()['state'] == 'cancelled'
    configure(mode='enforce', enforce_for='all', es2_knn=1)  # es2_knn's bulk share is 0: paused

    refused = client.post(f'/tasks/{cancelled}/retry/', HTTP_PREFER='respond-async')
    assert refused.status_code == 429, refused.content
    assert refused.json()['error_code'] == 'capacity_exceeded' and refused.json()['scope'] == 'es2_knn'
    assert refused['X-OCL-Capacity-Decision'] == 'refused' and int(refused['Retry-After']) > 0
    assert Call.objects.count() == 1  # nothing was recorded for it

    configure(mode='enforce', enforce_for='all', es2_knn=3)
    admitted = client.post(f'/tasks/{cancelled}/retry/', HTTP_PREFER='respond-async')
    assert admitted.status_code == 202 and admitted['X-OCL-Capacity-Decision'] == 'admitted'
    assert admitted['Location'] == f'/tasks/{admitted.json()["id"]}/' and 'RateLimit' in admitted
    assert Call.objects.get(pk=admitted.json()['id']).run_id == 'run-x'


@pytest.mark.parametrize('key', ['mapper-batch-7', 'k' * 255])
def test_a_retry_sent_with_its_original_calls_idempotency_key_is_a_new_call_and_its_resend_the_same(
        key, broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(es2_knn=1)  # es2_knn paused: every $match waits in its queue
    client = api_as(make_user())
    body = {'rows': distinct(ROWS), 'target_repo_url': tiny_source}

    def send():
        return client.post('/concepts/$match/?semantic=true', body, format='json', HTTP_PREFER='respond-async',
                           HTTP_IDEMPOTENCY_KEY=key)

    original = send().json()['id']
    assert client.delete(f'/tasks/{original}/').json()['state'] == 'cancelled'

    retried = client.post(f'/tasks/{original}/retry/', HTTP_PREFER='respond-async', HTTP_IDEMPOTENCY_KEY=key)
    assert retried.status_code == 202, retried.content
    again = retried.json()['id']
    assert again != original and retried.json()['state'] == 'queued'
    assert retried['X-OCL-Capacity-Decision'] == 'shadow-refused'  # sent (es2_knn paused): it took leases
    assert holds(lanes_redis, again) > 0

    # The same retry sent twice (a lost answer) is one call; the client's own POST sent again is its call.
    resent = client.post(f'/tasks/{original}/retry/', HTTP_PREFER='respond-async', HTTP_IDEMPOTENCY_KEY=key)
    assert (resent.status_code, resent.json()['id']) == (202, again)
    replayed = send()
    assert (replayed.status_code, replayed.json()['id'], replayed.json()['state']) == (202, original, 'cancelled')
    assert Call.objects.count() == 2
