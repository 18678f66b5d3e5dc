"""Bad input gets a clear 4xx naming what was wrong, and odd headers are ignored safely."""
import json

import pytest

from capacity.constants import Lane
from capacity.keys import lane_key
from workers.models import Call

pytestmark = pytest.mark.redis


def record_of(call):
    """The admission part of the call's log line, as its row holds it."""
    from capacity.admission import log_record
    from workers.lifecycle import admission_of
    return log_record(admission_of(call))


def post(client, body, query='semantic=true', **headers):
    """A polling client's submission (a handle at once): Prefer: respond-async unless the test says."""
    headers.setdefault('HTTP_PREFER', 'respond-async')
    return client.post(f'/concepts/$match/?{query}', body, format='json', **headers)


def test_a_body_over_the_size_limit_is_a_413_before_it_is_read(make_user, api_as, settings, db):
    settings.MAX_REQUEST_BYTES = 10_000
    response = post(api_as(make_user()), {'rows': [{'name': 'x' * 20_000}], 'target_repo_url': '/o/'})
    assert response.status_code == 413
    assert response.json()['error_code'] == 'request_too_large' and '10000' in response.json()['detail']


@pytest.mark.parametrize('body, field', [
    ({'rows': [{'name': 'a'}] * 1001}, 'rows'),
    ({'rows': [{'name': 'a' * 1001}]}, 'rows'),
    ({'rows': [{'name': ''}]}, 'rows'),
    ({'rows': 'a,b'}, 'rows'),
    ({'rows': [{'name': 'a'}], 'limit': 0}, 'limit'),
    ({'rows': [{'name': 'a'}], 'limit': 'five'}, 'limit'),
    ({'rows': [{'name': 'a'}], 'limit': '²'}, 'limit'),   # a digit to str.isdigit, not to int()
    ({'rows': [{'name': 'a'}], 'limit': '①'}, 'limit'),
    ({'rows': [{'name': 'a'}], 'target_repo_url': 42}, 'target_repo_url'),
])
def test_invalid_match_bodies_are_400s_naming_the_field_and_take_no_lease(
        body, field, make_user, api_as, tiny_source, lanes_redis):
    user = make_user()
    response = post(api_as(user), {'target_repo_url': tiny_source, **body})
    assert response.status_code == 400
    assert field in response.json()['detail']
    assert response.json()['error_code'] == 'invalid'
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0


def test_a_body_that_is_not_json_is_a_400(make_user, api_as, db):
    response = api_as(make_user()).post('/concepts/$match/?semantic=true', data='{"rows": [', content_type=
                                        'application/json')
    assert response.status_code == 400 and response.json()['error_code'] == 'malformed_request'


@pytest.mark.parametrize('metadata', ['{not json', '[1, 2]', '"capacity_aware"', json.dumps({'capacity_aware': {}}),
                                      'x' * 5000])
@pytest.mark.parametrize('trace', ['Root=nope', 'Root=1-zzzz-1', 'garbage;;==;', 'Self=1-ffffffffffff-x'])
def test_malformed_metadata_and_trace_headers_are_ignored(
        metadata, trace, make_user, api_as, tiny_source, lanes_redis, broker):
    response = post(api_as(make_user()), {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source},
                    HTTP_X_OCL_EVENT_METADATA=metadata, HTTP_X_AMZN_TRACE_ID=trace)
    assert response.status_code == 202
    assert response['X-OCL-Capacity-Decision'] == 'admitted'
    record = record_of(Call.objects.get(pk=response.json()['id']))
    assert record.get('queue_ms') is None and record['enforced'] is False


def test_an_overlong_idempotency_key_is_a_400(make_user, api_as, tiny_source, lanes_redis, broker):
    response = post(api_as(make_user()), {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source},
                    HTTP_IDEMPOTENCY_KEY='k' * 256)
    assert response.status_code == 400 and 'Idempotency-Key' in response.json()['detail']


@pytest.mark.parametrize('wait', ['soon', '-5', '1e9'])
def test_a_bad_long_poll_wait_is_a_400_or_clamped(wait, make_user, api_as, tiny_source, lanes_redis, broker):
    client = api_as(make_user())
    call_id = post(client, {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source}).json()['id']
    response = client.get(f'/tasks/{call_id}/?wait={wait}')
    assert response.status_code in (200, 400)
    if response.status_code == 400:
        assert 'wait' in response.json()['detail']


def test_malformed_config_bodies_change_nothing(make_user, api_as, db):
    staff = api_as(make_user(is_staff=True))
    for body in ([1], {'tiers': {'preview': 'two'}}, {'mode': 'loud'}, {'api_heavy': 3}, {'note': 5}):
        response = staff.patch('/capacity/config/', body, format='json')
        assert response.status_code == 400, body
    assert staff.get('/capacity/config/').json()['version'] is None


def raw_post(client, path, text, **headers):
    return client.generic('POST', path, text.encode('utf-8', 'surrogatepass'), content_type='application/json',
                          **headers)


@pytest.mark.parametrize('path, text, field', [
    ('/concepts/$match/?semantic=true', '{"rows": [{"name": "\\ud800"}], "target_repo_url": "/orgs/HL/sources/'
     'TinyClinical/"}', 'rows[0].name'),
    ('/concepts/$rerank/', '{"q": "\\udfff chest", "rows": [{"name": "a"}]}', 'q'),
])
def test_a_lone_surrogate_is_a_400_naming_where_it_is(path, text, field, make_user, api_as, tiny_source,
                                                       lanes_redis, broker):
    user = make_user()
    response = raw_post(api_as(user), path, text)
    assert response.status_code == 400, response.content
    assert field in response.json()['detail']
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0 and not Call.objects.exists()


def test_json_nested_three_thousand_deep_is_a_400(make_user, api_as, db):
    response = raw_post(api_as(make_user()), '/concepts/$match/?semantic=true', '[' * 3000 + ']' * 3000)
    assert response.status_code == 400 and response.json()['error_code'] == 'malformed_request'


def test_metadata_nested_three_thousand_deep_is_ignored(make_user, api_as, tiny_source, lanes_redis, broker):
    response = post(api_as(make_user()), {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source},
                    HTTP_X_OCL_EVENT_METADATA='{"a": ' * 3000 + '1' + '}' * 3000)
    assert response.status_code == 202 and response['X-OCL-Capacity-Decision'] == 'admitted'


def test_an_idempotency_key_is_counted_in_characters(make_user, api_as, tiny_source, lanes_redis, broker):
    client = api_as(make_user())
    body = {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source}
    key = ('é' * 255).encode('utf-8').decode('latin-1')  # what WSGI hands over for UTF-8 header bytes
    first = post(client, body, HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 202, first.content
    assert Call.objects.get(pk=first.json()['id']).idempotency_key == 'é' * 255
    assert post(client, body, HTTP_IDEMPOTENCY_KEY=key).json()['id'] == first.json()['id']
    too_long = ('é' * 256).encode('utf-8').decode('latin-1')
    assert post(client, body, HTTP_IDEMPOTENCY_KEY=too_long).status_code == 400


def test_a_chunked_body_reaches_the_view():
    import io

    from api.wsgi import ChunkedBody
    seen = {}

    def app(environ, start_response):
        seen['length'] = environ['CONTENT_LENGTH']
        seen['body'] = environ['wsgi.input'].read(int(environ['CONTENT_LENGTH']))
        return []
    ChunkedBody(app, limit=100)({'wsgi.input_terminated': True, 'HTTP_TRANSFER_ENCODING': 'chunked',
                                 'wsgi.input': io.BytesIO(b'{"rows": []}')}, None)
    assert seen == {'length': '12', 'body': b'{"rows": []}'}
    ChunkedBody(app, limit=4)({'wsgi.input_terminated': True, 'HTTP_TRANSFER_ENCODING': 'chunked',
                               'wsgi.input': io.BytesIO(b'0123456789')}, None)
    assert seen['length'] == '5'  # one byte over the limit: the size limit answers 413


SOURCE = '"target_repo_url": "/orgs/HL/sources/TinyClinical/"'


@pytest.mark.parametrize('path, text, field', [
    # A number out of float range, in a value of every endpoint's body
    ('/concepts/$match/?semantic=true', '{"rows": [{"name": "fever", "x": 1e400}], ' + SOURCE + '}', 'rows[0].x'),
    ('/concepts/$match/?reranker=true', '{"rows": [{"name": "a"}, {"name": "b", "n": [1, -1e400]}], ' + SOURCE
     + '}', 'rows[1].n[1]'),
    ('/concepts/$match/', '{"rows": [{"name": "fever"}], "map_config": [{"w": 1E+999}], ' + SOURCE + '}',
     'map_config[0].w'),
    ('/concepts/$rerank/', '{"q": "fever", "rows": [{"display_name": "a", "search_meta": {"s": 1e400}}]}',
     'rows[0].search_meta.s'),
    # NUL, which PostgreSQL stores neither as text nor in jsonb
    ('/concepts/$match/?semantic=true', '{"rows": [{"name": "fe\\u0000ver"}], ' + SOURCE + '}', 'rows[0].name'),
    ('/concepts/$match/', '{"rows": [{"name": "fever"}], ' + SOURCE + ', "filter": {"a": "\\u0000"}}',
     'filter.a'),
    ('/concepts/$match/?semantic=true', '{"rows": [{"name": "fever", "k\\u0000": 1}], ' + SOURCE + '}', 'rows[0]'),
    ('/concepts/$rerank/', '{"q": "chest\\u0000pain", "rows": [{"display_name": "a"}]}', 'q'),
])
def test_input_no_database_or_renderer_takes_is_a_400_naming_where_it_is(
        path, text, field, each_database, make_user, api_as, tiny_source, lanes_redis, broker):
    user = make_user()
    response = raw_post(api_as(user), path, text, HTTP_PREFER='respond-async')
    assert response.status_code == 400, response.content[:300]
    assert response.json()['error_code'] == 'invalid' and field in response.json()['detail']
    assert lanes_redis.zcard(lane_key(Lane.USER, user.pk)) == 0 and not Call.objects.exists()


def test_a_config_note_with_nul_is_a_400(each_database, make_user, api_as):
    staff = api_as(make_user(is_staff=True))
    response = staff.generic('PATCH', '/capacity/config/', b'{"es2_knn": 5, "note": "a\\u0000b"}',
                             content_type='application/json')
    assert response.status_code == 400 and 'note' in response.json()['detail']
    assert staff.get('/capacity/config/').json()['version'] is None


@pytest.mark.parametrize('metadata', [
    '{"capacity_aware": "true", "algorithm_id": "a\\u0000b", "automatch_run_id": "run-1"}',
    '{"capacity_aware": "true", "algorithm_id": "\\ud800", "automatch_run_id": "run-1"}',
    '{"capacity_aware": "true", "algorithm_id": "x", "automatch_run_id": "\\udfff\\u0000"}',
])
def test_metadata_a_database_cant_store_is_ignored_as_documented(
        metadata, each_database, make_user, api_as, tiny_source, lanes_redis, broker):
    response = post(api_as(make_user()), {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source},
                    HTTP_X_OCL_EVENT_METADATA=metadata)
    assert response.status_code == 202, response.content[:300]
    assert response['X-OCL-Capacity-Decision'] == 'admitted'
    record = record_of(Call.objects.get(pk=response.json()['id']))
    assert record['enforced'] is False  # shadow mode; what the header said that can be stored is kept:
    kept = {name: record.get(name) for name in ('algorithm_id', 'automatch_run_id')}
    assert kept == {'algorithm_id': None, 'automatch_run_id': 'run-1'} or kept == {
        'algorithm_id': 'x', 'automatch_run_id': None}


def test_a_long_prefer_header_keeps_its_respond_async(make_user, api_as, tiny_source, lanes_redis, broker, configure):
    configure(wait={'default_seconds': 30, 'max_seconds': 30})  # no worker runs: a waiting call would wait 30 s
    padding = ', '.join(f'x-preference-{i}=value-{i}' for i in range(100))
    response = post(api_as(make_user()), {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source},
                    HTTP_PREFER=f'{padding}, respond-async')
    assert response.status_code == 202 and response['Preference-Applied'] == 'respond-async'


@pytest.mark.parametrize('path, field', [
    ('/tasks/?page=²', 'page'),          # a digit to str.isdigit that int() refuses: it was a 500
    ('/tasks/?page_size=²', 'page_size'),
    ('/tasks/?page=١', 'page'),          # Arabic-Indic one: int() reads it as 1
    ('/tasks/?page_size=٣', 'page_size'),
    ('/tasks/?page_size=1_0', 'page_size'),  # int() reads it as 10
    ('/tasks/{call}/?wait=٣', 'wait'),
    ('/tasks/{call}/?wait=²', 'wait'),
    ('/tasks/{call}/?wait=+1', 'wait'),
    ('/concepts/$match/?limit=' + '9' * 5000, 'limit'),  # more digits than int() reads: it was a 500
    ('/capacity/config/history/?limit=٣', 'limit'),
    ('/capacity/config/history/?limit=²', 'limit'),
    ('/capacity/decisions/?minutes=٣', 'minutes'),
])
def test_a_number_in_the_query_that_is_not_ascii_digits_is_a_400_naming_it(
        path, field, make_user, api_as, tiny_source, lanes_redis, broker):
    client = api_as(make_user(is_staff=True))
    call_id = post(client, {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source}).json()['id']
    path = path.format(call=call_id)
    if path.startswith('/concepts/'):
        response = client.post(path, {'rows': [{'name': 'fever'}], 'target_repo_url': tiny_source}, format='json')
    else:
        response = client.get(path)
    assert response.status_code == 400, (path, response.status_code, response.content[:300])
    assert response.json()['error_code'] == 'invalid' and field in response.json()['detail'], response.json()
