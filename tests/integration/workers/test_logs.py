"""One JSON log format with the request id, on real processes: the id a request came with is in its
answer, on the call's row, in the worker's log lines for the call (Celery's own included) and in its
`ocl_capacity` line; gunicorn's access lines are JSON with the same id."""
import json
import os
import sys

import pytest
import requests

from devstack.processes import Child, free_port
from tests.integration.workers.conftest import ROOT, wait_until
from tests.integration.workers.test_queue import log_line_of, poll, submit
from workers.models import Call

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def json_lines(text):
    lines = []
    for line in text.splitlines():
        if line.startswith('{'):
            lines.append(json.loads(line))  # every line that looks like JSON is JSON
    return lines


def test_a_requests_id_reaches_its_calls_row_and_every_worker_line_about_it(
        start_worker, tiny_source, make_user, api_as):
    worker = start_worker(name='logs', queues=('es2_knn',))
    client = api_as(make_user())
    response = submit(client, tiny_source, headers={'HTTP_X_REQUEST_ID': 'req-7f3a.from-nginx'})
    assert response.status_code == 202 and response['X-Request-Id'] == 'req-7f3a.from-nginx'
    call_id = response.json()['id']
    assert Call.objects.get(pk=call_id).request_id == 'req-7f3a.from-nginx'
    assert poll(client, call_id).json()['state'] == 'succeeded'

    line = wait_until(lambda: log_line_of(worker, call_id), timeout=5, message="the call's ocl_capacity line")
    assert line['request_id'] == line['cid'] == 'req-7f3a.from-nginx'
    records = [r for r in json_lines(worker.output()) if r.get('task_id') == call_id and 'event' not in r]
    assert records, 'no log record of the call'
    assert {r['request_id'] for r in records} == {'req-7f3a.from-nginx'}
    assert any('succeeded' in r['message'] and r['logger'] == 'celery.app.trace' for r in records)
    other = client.get(f'/tasks/{call_id}/', HTTP_X_REQUEST_ID='not a valid id')
    assert other['X-Request-Id'] != 'not a valid id' and len(other['X-Request-Id']) == 32


def test_gunicorn_writes_json_access_lines_with_the_request_id(tmp_path, db):
    port = free_port()
    child = Child('gunicorn', [
        sys.executable, '-m', 'gunicorn', 'api.wsgi', '--bind', f'127.0.0.1:{port}', '--workers', '1',
        '--access-logfile', '-', '--error-logfile', '-', '--logger-class', 'api.gunicorn_logging.JsonLogger',
    ], tmp_path / 'gunicorn.log', cwd=ROOT).start({**os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings'})
    try:
        def answered():
            try:
                return requests.get(f'http://127.0.0.1:{port}/healthz', headers={'X-Request-Id': 'probe-1'},
                                    timeout=1)
            except requests.RequestException:
                return None
        response = wait_until(answered, timeout=30, interval=0.2, message='gunicorn to answer')
        assert response.headers['X-Request-Id'] == 'probe-1'
        access = wait_until(lambda: [r for r in json_lines(child.output()) if r.get('path') == '/healthz'],
                            timeout=5, message='the access line')
        assert access[0]['request_id'] == 'probe-1' and access[0]['status'] == 200
        assert access[0]['logger'] == 'gunicorn.access' and access[0]['method'] == 'GET'
        assert any(r['logger'] == 'gunicorn.error' for r in json_lines(child.output()))  # 'Booting worker'
    finally:
        child.stop(10)
