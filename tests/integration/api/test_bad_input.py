"""Bad input gets a clear 4xx naming what was wrong, and odd headers are ignored safely."""
import json

import pytest

from capacity.constants import Lane
from capacity.keys import lane_key
from workers.models import HeavyCall

pytestmark = pytest.mark.redis


def record_of(call):
    """The admission part of the call's log line, as its row holds it."""
    from capacity.admission import log_record
    from workers.lifecycle import admission_of
    return log_record(admission_of(call))


def post(client, body, query='semantic=true', **headers):
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
    record = record_of(HeavyCall.objects.get(pk=response.json()['id']))
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
