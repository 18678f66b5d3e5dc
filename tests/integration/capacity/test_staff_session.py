"""The staff endpoints from a browser: Django's session login works for them as the token does, a write by
session needs the session's CSRF token, and a request with neither is 401 as before."""
import pytest
from django.test import Client
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from capacity.models import CapacityConfig

pytestmark = pytest.mark.django_db

STAFF_ENDPOINTS = ('/capacity/config/', '/capacity/config/history/', '/capacity/status/',
                   '/capacity/decisions/')


def token_client(user=None):
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f'Token {user.auth_token.key}')
    return client


def session_client(user):
    """A browser's session: logged in, and refused any write that lacks the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_a_staff_session_reads_the_staff_endpoints_and_writes_only_with_the_csrf_token(lanes, make_user,
                                                                                       config_lines):
    staff = make_user(username='ada', is_staff=True)
    browser = session_client(staff)
    for path in STAFF_ENDPOINTS:
        assert browser.get(path).status_code == 200, path

    change = {'es2_knn': 5, 'note': 'from a browser'}
    refused = browser.patch('/capacity/config/', change, content_type='application/json')
    assert refused.status_code == 403 and 'CSRF' in refused.json()['detail']
    csrf_token = get_random_string(32)  # what a page puts in the cookie and sends back in the header
    browser.cookies['csrftoken'] = csrf_token
    refused = browser.patch('/capacity/config/', change, content_type='application/json',
                            HTTP_X_CSRFTOKEN=get_random_string(32))
    assert refused.status_code == 403 and 'CSRF' in refused.json()['detail']
    assert CapacityConfig.objects.count() == 0

    saved = browser.patch('/capacity/config/', change, content_type='application/json',
                          HTTP_X_CSRFTOKEN=csrf_token)
    assert saved.status_code == 200, saved.content
    assert saved.json()['changes'] == {'es2_knn': [3, 5]}
    row = CapacityConfig.get_latest()
    assert (row.created_by, row.note, row.source) == (staff, 'from a browser', 'api')


def test_a_session_that_is_not_staff_is_refused_and_no_login_is_401(lanes, make_user):
    user = session_client(make_user())
    for path in STAFF_ENDPOINTS:
        assert user.get(path).status_code == 403, path
        response = Client().get(path)
        assert (response.status_code, response['WWW-Authenticate']) == (401, 'Token'), path


def test_tokens_still_work_and_need_no_csrf_token(lanes, make_user):
    staff = token_client(make_user(is_staff=True))
    for path in STAFF_ENDPOINTS:
        assert staff.get(path).status_code == 200, path
        assert token_client().get(path).status_code == 401, path
        assert token_client(make_user()).get(path).status_code == 403, path
    assert staff.patch('/capacity/config/', {'es2_knn': 4}, format='json').status_code == 200


def test_the_decisions_endpoint_answers_the_minutes_of_the_last_hour(lanes, make_user):
    staff = token_client(make_user(is_staff=True))
    answer = staff.get('/capacity/decisions/').json()
    assert answer['redis'] == 'ok' and len(answer['series']) == 60
    assert [set(minute) for minute in answer['series']] == [{'minute', 'decisions'}] * 60
    assert len(staff.get('/capacity/decisions/', {'minutes': 10}).json()['series']) == 10


def test_the_decisions_endpoint_says_so_when_redis_cannot_answer(lanes, make_user):
    from capacity.store import get_store
    get_store().mark_unavailable()  # as after a Redis error: the skip window is open
    answer = token_client(make_user(is_staff=True)).get('/capacity/decisions/').json()
    assert answer['series'] == [] and answer['redis'].startswith('skipped')
