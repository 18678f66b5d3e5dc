"""What Django answers without a view is the API's JSON (api.errors), not a debug page, and DEBUG is off
unless asked for."""
import os
import subprocess
import sys

import pytest
from django.conf import settings as django_settings

from tests.unit.api.test_settings import ROOT


def test_a_path_no_view_serves_is_a_json_404(client, db):
    response = client.get('/no/such/path/')
    assert response.status_code == 404 and response['Content-Type'] == 'application/json'
    assert response.json() == {'detail': 'Not found.', 'error_code': 'not_found'}


def test_an_exception_no_view_handles_is_a_json_500_that_names_the_request(client, make_user, monkeypatch, db):
    from api.views import HealthView

    def broken(self, request):
        raise RuntimeError('a bug')
    monkeypatch.setattr(HealthView, 'get', broken)
    client.raise_request_exception = False
    response = client.get('/healthz', HTTP_X_REQUEST_ID='req-500')
    assert response.status_code == 500 and response['Content-Type'] == 'application/json'
    assert response.json()['error_code'] == 'server_error' and response['X-Request-Id'] == 'req-500'
    assert len(response.content) < 200  # no stack, no settings


def test_a_host_not_allowed_is_a_json_400(client, settings, db):
    settings.ALLOWED_HOSTS = ['api.example']
    response = client.get('/healthz', HTTP_HOST='evil.example')
    assert response.status_code == 400 and response.json()['error_code'] == 'bad_request'


@pytest.mark.parametrize('value, expected', [(None, 'False'), ('true', 'True'), ('false', 'False')])
def test_debug_is_off_unless_asked_for_also_outside_production(value, expected):
    environ = {k: v for k, v in os.environ.items() if k not in ('DEBUG', 'HEAVY_LANES_PRODUCTION')}
    if value is not None:
        environ['DEBUG'] = value
    result = subprocess.run(
        [sys.executable, 'manage.py', 'shell', '-c', 'from django.conf import settings; print(settings.DEBUG)'],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**environ, 'DJANGO_SETTINGS_MODULE': 'api.settings', 'HEAVY_LANES_VAR_DIR': str(django_settings.VAR_DIR)})
    assert result.stdout.strip().splitlines()[-1] == expected, result.stderr[-500:]


def test_outside_production_only_the_loopback_names_make_run_listens_on_are_allowed_hosts():
    environ = {k: v for k, v in os.environ.items() if k not in ('ALLOWED_HOSTS', 'HEAVY_LANES_PRODUCTION')}
    result = subprocess.run(
        [sys.executable, 'manage.py', 'shell', '-c', 'from django.conf import settings; print(settings.ALLOWED_HOSTS)'],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        env={**environ, 'DJANGO_SETTINGS_MODULE': 'api.settings', 'HEAVY_LANES_VAR_DIR': str(django_settings.VAR_DIR)})
    assert result.stdout.strip().splitlines()[-1] == "['.localhost', '127.0.0.1', '[::1]']", result.stderr[-500:]
