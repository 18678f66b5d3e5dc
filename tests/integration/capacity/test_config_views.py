"""The staff endpoints GET/PATCH/PUT /capacity/config/ and GET /capacity/config/history/."""
import json

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from capacity.config import get_config, get_defaults, merge
from capacity.models import CapacityConfig

pytestmark = pytest.mark.django_db

CONFIG_URL = '/capacity/config/'
HISTORY_URL = '/capacity/config/history/'


def client_for(user=None):
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f'Token {user.auth_token.key}')
    return client


@pytest.fixture
def staff(make_user):
    return client_for(make_user(username='ada', is_staff=True))


def test_the_urls_have_their_names():
    assert reverse('capacity-config') == CONFIG_URL
    assert reverse('capacity-config-history') == HISTORY_URL


def test_config_is_staff_only(make_user):
    anonymous = client_for()
    assert anonymous.get(CONFIG_URL).status_code == 401
    assert anonymous.get(HISTORY_URL).status_code == 401
    assert anonymous.patch(CONFIG_URL, {'mode': 'off'}, format='json').status_code == 401

    user = client_for(make_user())
    assert user.get(CONFIG_URL).status_code == 403
    assert user.get(HISTORY_URL).status_code == 403
    assert user.patch(CONFIG_URL, {'mode': 'off'}, format='json').status_code == 403
    assert user.put(CONFIG_URL, {'mode': 'off'}, format='json').status_code == 403
    assert CapacityConfig.objects.count() == 0


def test_get_config_with_no_versions_gives_the_defaults(staff):
    response = staff.get(CONFIG_URL)
    assert response.status_code == 200
    assert response.json() == {
        'version': None, 'created_by': None, 'created_at': None, 'source': None, 'note': None,
        'config': get_defaults(), 'defaults': get_defaults(),
    }


def test_change_config_and_read_its_history(staff, config_lines):
    response = staff.patch(CONFIG_URL, {'tiers': {'preview': 1}, 'note': 'busy day'}, format='json')
    assert response.status_code == 200
    patched = response.json()
    assert patched['changes'] == {'tiers.preview': [2, 1]}
    assert (patched['created_by'], patched['note'], patched['source']) == ('ada', 'busy day', 'api')
    assert patched['version'] == CapacityConfig.get_latest().id
    assert patched['config'] == merge(get_defaults(), {'tiers': {'preview': 1}})
    assert get_config().tiers.preview == 1
    assert staff.get(CONFIG_URL).json()['config'] == patched['config']

    response = staff.put(CONFIG_URL, {'mode': 'off'}, format='json')
    assert response.status_code == 200
    assert response.json()['changes'] == {'mode': ['shadow', 'off'], 'tiers.preview': [1, 2]}
    assert response.json()['config'] == merge(get_defaults(), {'mode': 'off'})
    assert response.json()['note'] is None
    assert [line['version'] for line in config_lines] == [patched['version'], response.json()['version']]

    [latest] = staff.get(HISTORY_URL, {'limit': 1}).json()
    assert latest['version'] == response.json()['version']
    history = staff.get(HISTORY_URL).json()
    assert [item['version'] for item in history] == [response.json()['version'], patched['version']]
    assert history[1]['changes'] == {'tiers.preview': [2, 1]}
    assert (history[1]['created_by'], history[1]['note']) == ('ada', 'busy day')
    assert history[1]['created_at'] == patched['created_at']


def test_a_change_that_changes_nothing_adds_no_version(staff, config_lines):
    first = staff.patch(CONFIG_URL, {'es2_knn': 2}, format='json').json()
    response = staff.patch(CONFIG_URL, {'es2_knn': 2, 'note': 'again'}, format='json')
    assert response.status_code == 200
    assert response.json()['changes'] == {}
    assert response.json()['version'] == first['version']
    assert response.json()['note'] is None  # the version in force, not the note of a change never made
    assert CapacityConfig.objects.count() == 1
    assert len(config_lines) == 1


@pytest.mark.parametrize('body, detail', [
    ({'es2_knn': -1}, ['"es2_knn" must be a whole number from 0 to 100000.']),
    ({'bogus': 1, 'tiers': 5}, ['Unknown setting "bogus".', 'tiers must be an object.']),
    ({'wait': {'default_seconds': 901}}, ['"wait.default_seconds" can\'t be more than "wait.max_seconds".']),
    ({'mode': 'off', 'note': 7}, '"note" must be a string.'),
    ([{'mode': 'off'}], 'Send a JSON object.'),
    (None, 'Send a JSON object.'),
])
@pytest.mark.parametrize('method', ['patch', 'put'])
def test_change_config_rejects_bad_input(staff, config_lines, method, body, detail):
    response = getattr(staff, method)(CONFIG_URL, json.dumps(body), content_type='application/json')
    assert response.status_code == 400
    assert response.json() == {'detail': detail}
    assert CapacityConfig.objects.count() == 0
    assert config_lines == []


def test_a_form_body_is_refused(staff):
    response = staff.patch(CONFIG_URL, 'mode=off', content_type='application/x-www-form-urlencoded')
    assert response.status_code == 415
    assert CapacityConfig.objects.count() == 0


@pytest.mark.parametrize('limit, expected', [('2', 2), ('', 3), (None, 3)])
def test_the_history_limit_takes_the_newest_versions_and_defaults_to_fifty(staff, limit, expected):
    for knn in (1, 2, 3):
        staff.patch(CONFIG_URL, {'es2_knn': knn}, format='json')
    query = {} if limit is None else {'limit': limit}
    assert len(staff.get(HISTORY_URL, query).json()) == expected


@pytest.mark.parametrize('limit', ['0', '-4', 'many', '٣', '501', '1000'])
def test_a_history_limit_that_is_not_a_whole_number_from_1_to_500_is_a_400_naming_it(staff, limit):
    response = staff.get(HISTORY_URL, {'limit': limit})
    assert response.status_code == 400 and 'limit' in response.json()['detail'], response.content


def test_the_history_limit_is_at_most_500(staff):
    CapacityConfig.objects.bulk_create(
        CapacityConfig(config=get_defaults(), source='command') for _ in range(501))
    assert len(staff.get(HISTORY_URL, {'limit': 500}).json()) == 500
