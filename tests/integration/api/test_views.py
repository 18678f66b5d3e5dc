"""LIMITER.md §8 CapacityViewsTest, adapted to heavy calls that answer 202 with a task handle."""
import json
from unittest import mock

import pytest
from django.conf import settings

from capacity.constants import HEADERS, Lane
from capacity.keys import lane_key
from workers.models import Call, Work

pytestmark = pytest.mark.redis
ROWS = [{'name': 'a'}, {'name': 'b'}]


def record_of(call):
    """The admission part of the call's log line, as its row holds it."""
    from capacity.admission import log_record
    from workers.lifecycle import admission_of
    return log_record(admission_of(call))


@pytest.fixture
def lines():
    with mock.patch('workers.submission.emit') as emit:
        yield emit


def match(client, source, query='semantic=true', rows=ROWS):
    return client.post(f'/concepts/$match/?{query}', {'rows': rows, 'target_repo_url': source}, format='json',
                       HTTP_PREFER='respond-async')


def rerank(client, body):
    return client.post('/concepts/$rerank/', body, format='json', HTTP_PREFER='respond-async')


def test_cors_exposes_the_capacity_headers_and_allows_the_metadata_header():
    exposed = {header.lower() for header in settings.CORS_EXPOSE_HEADERS}
    assert {header.lower() for header in HEADERS} | {'retry-after', 'location'} <= exposed
    assert 'x-ocl-event-metadata' in {header.lower() for header in settings.CORS_ALLOW_HEADERS}


def test_cors_preflight_and_response_headers(client, db):
    preflight = client.options('/concepts/$match/', HTTP_ORIGIN='https://mapper.example',
                               HTTP_ACCESS_CONTROL_REQUEST_METHOD='POST',
                               HTTP_ACCESS_CONTROL_REQUEST_HEADERS='x-ocl-event-metadata, idempotency-key')
    assert preflight.status_code == 200
    assert 'x-ocl-event-metadata' in preflight['Access-Control-Allow-Headers']


def test_semantic_match_is_counted_and_carries_the_headers(broker, lanes_redis, tiny_source, make_user, api_as):
    user = make_user()
    response = match(api_as(user), tiny_source)
    assert response.status_code == 202
    assert response['X-OCL-Capacity-Decision'] == 'admitted'
    assert response['X-OCL-Capacity-Tier'] == 'preview'
    assert response['X-OCL-Capacity-In-Flight'] == '1'
    # The 202's Retry-After is when to poll first: nothing measured yet, so its place in the queue (1).
    assert response['Retry-After'] == '1'
    assert response.json()['estimated_start_at'] is None and response.json()['estimated_finish_at'] is None
    call = Call.objects.get(pk=response.json()['id'])
    assert record_of(call)['endpoint'] == '$match' and record_of(call)['rows'] == 2
    assert record_of(call)['semantic'] is True
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 1  # held while queued


def test_lexical_match_is_not_a_heavy_call(broker, lanes_redis, tiny_source, make_user, api_as, lines):
    response = match(api_as(make_user()), tiny_source, query='')
    assert response.status_code == 200
    assert not any(header in response for header in HEADERS)
    assert response.json()[0]['row'] == {'name': 'a'} and response['num_returned'] == '0'
    assert Call.objects.count() == 0 and lines.call_count == 0


def test_reranked_lexical_match_is_a_heavy_call(broker, lanes_redis, tiny_source, make_user, api_as):
    response = match(api_as(make_user()), tiny_source, query='reranker=true')
    assert response.status_code == 202 and response['X-OCL-Capacity-Decision'] == 'admitted'
    record = record_of(Call.objects.get(pk=response.json()['id']))
    assert record['semantic'] is False and record.get('es2_knn_limit') is None
    assert response.json()['lane'] == 'api_heavy'


def test_enforce_refuses_a_match_before_charging_any_usage(
        broker, lanes_redis, tiny_source, make_user, api_as, configure, lines):
    configure(mode='enforce', enforce_for='all', per_user={'staff': 4, 'core': 3, 'early_access': 2, 'preview': 0})
    response = match(api_as(make_user()), tiny_source)
    assert response.status_code == 429
    assert response['Retry-After'] == '120' and response['X-OCL-Capacity-Decision'] == 'refused'
    assert response.json()['error_code'] == 'capacity_exceeded'
    assert Call.objects.count() == 0
    assert lines.call_args.args[0]['state'] == 'refused'


def test_a_limiter_error_in_enforce_mode_lets_the_match_through(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(mode='enforce', enforce_for='all', per_user={'staff': 4, 'core': 3, 'early_access': 2, 'preview': 0})
    with mock.patch('capacity.decisions.retry_after', side_effect=RuntimeError('boom')):
        response = match(api_as(make_user()), tiny_source)
    assert response.status_code == 202 and response['X-OCL-Capacity-Decision'] == 'unavailable'
    assert Call.objects.filter(endpoint='$match', rows=2).count() == 1


def test_shadow_mode_charges_and_queues_as_usual(broker, lanes_redis, tiny_source, make_user, api_as, configure):
    configure(per_user={'staff': 4, 'core': 3, 'early_access': 2, 'preview': 0})
    response = match(api_as(make_user()), tiny_source)
    assert response.status_code == 202 and response['X-OCL-Capacity-Decision'] == 'shadow-refused'
    assert response['Retry-After'] == '1'  # a poll hint, not the refusal's wait (shadow refuses nothing)
    assert Call.objects.count() == 1


def test_rerank_is_counted_and_carries_the_headers(broker, lanes_redis, tiny_source, make_user, api_as):
    response = rerank(api_as(make_user()), {'q': 'fever', 'rows': [{'name': 'Fever'}, {'name': 'Cough'}]})
    assert response.status_code == 202 and response['X-OCL-Capacity-Decision'] == 'admitted'
    record = record_of(Call.objects.get(pk=response.json()['id']))
    assert (record['endpoint'], record['rows'], record['single_row']) == ('$rerank', 2, False)


def test_enforce_refuses_a_rerank_before_any_work(broker, lanes_redis, make_user, api_as, configure):
    configure(mode='enforce', enforce_for='all', tiers={'staff': 4, 'core': 4, 'early_access': 3, 'preview': 0})
    response = rerank(api_as(make_user()), {'q': 'fever', 'rows': [{'name': 'Fever'}]})
    assert response.status_code == 429 and Call.objects.count() == 0


def test_an_invalid_rerank_is_not_counted(broker, lanes_redis, make_user, api_as):
    user = make_user()
    response = rerank(api_as(user), {'rows': [{'name': 'Fever'}]})
    assert response.status_code == 400
    assert 'q' in json.dumps(response.json()['detail'])
    assert 'X-OCL-Capacity-Decision' not in response
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0


def test_an_unknown_target_repo_is_a_400_naming_the_field(broker, lanes_redis, tiny_source, make_user, api_as):
    response = match(api_as(make_user()), '/orgs/nobody/sources/nothing/')
    assert response.status_code == 400 and 'target_repo_url' in response.json()['detail']


def test_anonymous_heavy_calls_are_401(client, db):
    assert client.post('/concepts/$match/?semantic=true', {}, content_type='application/json').status_code == 401


def test_a_handles_first_poll_hint_is_its_place_in_the_queue_earlier_tiers_first(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    many = {'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9}
    configure(per_user=many, tiers=many)
    preview, staff = api_as(make_user()), api_as(make_user(is_staff=True))
    rows = [[{'name': name}, {'name': 'b'}] for name in 'vwxyz']  # each call its own work
    hints = [match(preview, tiny_source, rows=rows[i])['Retry-After'] for i in range(3)]
    assert hints == ['1', '2', '3']  # nothing measured yet: the place (1-10 s)
    assert match(staff, tiny_source, rows=rows[3])['Retry-After'] == '1'  # a staff call runs before them
    last = match(preview, tiny_source, rows=rows[4])
    assert last['Retry-After'] == '5'
    assert preview.get(f'/tasks/{last.json()["id"]}/').json()['position'] == 5  # the rows say the same


def test_status_view(broker, lanes_redis, tiny_source, make_user, api_as):
    match(api_as(make_user()), tiny_source)
    status = api_as(make_user(is_staff=True)).get('/capacity/status/').json()
    assert status['api_heavy']['in_flight'] == 1 and status['mode'] == 'shadow'
    assert status['queues']['es2_knn']['depth'] == 1
    assert api_as(make_user()).get('/capacity/status/').status_code == 403


def test_polls_and_handles_say_when_a_call_should_start_and_finish_from_measured_run_times(
        broker, lanes_redis, tiny_source, make_user, api_as, configure):
    from datetime import timedelta

    from django.utils import timezone

    from capacity.keys import holds_key, run_field
    configure(per_user={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9},
              tiers={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9})  # es2_knn's pool: 3 - 1 = 2
    lanes_redis.hset(holds_key(), run_field('es2_knn'), 4000)  # its calls run 4 s
    client = api_as(make_user())
    first, second, third = (match(client, tiny_source, rows=[{'name': name}, {'name': 'b'}])
                            for name in 'xyz')
    # Nothing runs yet: the first two start now on the two workers, the third after one of them.
    assert (first['Retry-After'], second['Retry-After'], third['Retry-After']) == ('4', '4', '8')
    now = timezone.now()
    assert abs((parse(third.json()['estimated_start_at']) - now).total_seconds() - 4) < 1
    # The first starts; 1 s later it has 3 s left, so the third starts in 3 s and ends in 7.
    started = now - timedelta(seconds=1)
    Work.objects.filter(pk=first.json()['id']).update(state='running', started_at=started)
    running = client.get(f'/tasks/{first.json()["id"]}/')
    assert running['Retry-After'] == '3' and running.json()['estimated_start_at'] is None
    assert abs((parse(running.json()['estimated_finish_at']) - started).total_seconds() - 4) < 1
    waiting = client.get(f'/tasks/{third.json()["id"]}/')
    body = waiting.json()
    assert body['position'] == 2 and waiting['Retry-After'] == '7'
    run = parse(body['estimated_finish_at']) - parse(body['estimated_start_at'])
    assert abs(run.total_seconds() - 4) < 0.01


def parse(text):
    from django.utils.dateparse import parse_datetime
    return parse_datetime(text)


def ratelimit_items(response, header):
    import http_sf
    return {name: dict(params) for name, params in http_sf.parse(response[header].encode(), tltype='list')}


@pytest.fixture
def rate_limit(lanes_redis):
    """The rate limit, counted in this test's own lane store (an empty window, no skip window)."""
    from api.throttles import HeavyRateThrottle
    return HeavyRateThrottle


def test_gated_answers_carry_the_ratelimit_fields_of_their_concurrency_lanes(
        broker, lanes_redis, tiny_source, make_user, api_as, configure, rate_limit):
    configure(mode='enforce', enforce_for='all')
    client = api_as(make_user())  # preview: 1 call at once
    admitted = match(client, tiny_source)
    assert admitted.status_code == 202
    policy = ratelimit_items(admitted, 'RateLimit-Policy')
    assert policy['user'] == {'q': 1, 'qu': 'concurrent-requests'}
    assert policy['tier'] == {'q': 2, 'qu': 'concurrent-requests', 'pk': b'preview'}
    assert policy['es2_knn'] == {'q': 2, 'qu': 'concurrent-requests'} and 'api_heavy' in policy
    assert policy['rate'] == {'q': 600, 'w': 60}  # HEAVY_RATE_LIMIT's default, 600/min
    left = ratelimit_items(admitted, 'RateLimit')
    assert left['user'] == {'r': 0} and left['es2_knn'] == {'r': 1}
    assert left['tier'] == {'r': 1, 'pk': b'preview'}
    refused = match(client, tiny_source, rows=[{'name': 'another'}, {'name': 'call'}])
    assert refused.status_code == 429
    # The full lane has nothing left until the Retry-After; the rate limit wasn't asked (no allowance spent).
    assert ratelimit_items(refused, 'RateLimit')['user'] == {'r': 0, 't': int(refused['Retry-After'])}
    assert 'rate' not in ratelimit_items(refused, 'RateLimit-Policy')


def test_a_rate_limit_429_carries_the_ratelimit_fields_of_the_rate(
        broker, lanes_redis, tiny_source, make_user, api_as, monkeypatch, rate_limit):
    monkeypatch.setitem(rate_limit.THROTTLE_RATES, 'heavy', '2/min')
    client = api_as(make_user('core_user'))
    answers = [match(client, tiny_source, rows=[{'name': name}]) for name in ('p', 'q', 'r')]
    assert [answer.status_code for answer in answers] == [202, 202, 429]
    assert ratelimit_items(answers[0], 'RateLimit')['rate'] == {'r': 1, 't': 60}
    limited = answers[2]
    assert ratelimit_items(limited, 'RateLimit-Policy') == {'rate': {'q': 2, 'w': 60}}
    window = ratelimit_items(limited, 'RateLimit')['rate']
    assert window['r'] == 0 and 58 <= window['t'] <= 60 and int(limited['Retry-After']) >= window['t']


def test_cors_exposes_the_ratelimit_fields():
    exposed = {header.lower() for header in settings.CORS_EXPOSE_HEADERS}
    assert {'ratelimit', 'ratelimit-policy', 'retry-after'} <= exposed
