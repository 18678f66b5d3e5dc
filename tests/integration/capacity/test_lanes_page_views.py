"""The staff lanes page at /capacity/dashboard/ over HTTP: staff only, with a way to log in for the others;
what the page is given to read. tests/acceptance/test_lanes_page.py drives it in a browser."""
import pytest
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

DASHBOARD = '/capacity/dashboard/'


def session_client(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def test_the_lanes_page_is_for_staff_and_says_so_to_others(make_user):
    anonymous = Client().get(DASHBOARD, HTTP_ACCEPT='text/html')
    assert anonymous.status_code == 401
    assert anonymous['WWW-Authenticate'] == 'Token'  # the API's challenge, not a Basic prompt
    assert b'/admin/login/?next=/capacity/dashboard/' in anonymous.content

    refused = session_client(make_user()).get(DASHBOARD, HTTP_ACCEPT='text/html')
    assert refused.status_code == 403 and b'Staff only' in refused.content
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f'Token {make_user().auth_token.key}')
    assert api.get(DASHBOARD, HTTP_ACCEPT='application/json').json()['error_code'] == 'permission_denied'

    page = session_client(make_user(username='ada', is_staff=True)).get(DASHBOARD, HTTP_ACCEPT='text/html')
    assert page.status_code == 200 and page['Content-Type'].startswith('text/html')
    html = page.content.decode()
    for url in ('/capacity/status/', '/capacity/config/', '/capacity/config/history/', '/capacity/decisions/',
                '/static/capacity/dashboard.js', '/static/capacity/dashboard.css'):
        assert url in html, url
    assert 'ada' in html
    assert 'http://' not in html and 'https://' not in html  # nothing from another host
    assert page.cookies['csrftoken'].value  # the token the page's writes send back


def test_asked_for_json_the_page_answers_what_it_reads(make_user):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f'Token {make_user(is_staff=True).auth_token.key}')
    answer = api.get(DASHBOARD, HTTP_ACCEPT='application/json').json()
    assert answer['urls'] == {'status': '/capacity/status/', 'config': '/capacity/config/',
                              'history': '/capacity/config/history/', 'decisions': '/capacity/decisions/'}
    assert answer['refresh_seconds'] == 3
