"""An API process killed in the middle of a request: no call recorded as submitted that isn't in the
queue, and no lease outlives its expiry."""
import os
import signal
import sys
import threading

import pytest
import requests
from django.db import connection

from capacity.constants import Lane
from capacity.keys import lane_key
from devstack.processes import Child, free_port
from tests.integration.workers.conftest import ROOT, wait_until
from workers.models import Work
from workers.status import depth

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture
def gunicorn(broker, lanes_redis, key_prefix, tmp_path):
    port = free_port()
    env = {**os.environ, 'DJANGO_SETTINGS_MODULE': 'tests.settings', 'CAPACITY_KEY_PREFIX': key_prefix,
           'HEAVY_LANES_WORKER_DB': str(connection.settings_dict['NAME']), 'CAPACITY_TASK_ID': 'api-a'}
    child = Child('gunicorn', [
        sys.executable, '-m', 'gunicorn', 'api.wsgi', '--bind', f'127.0.0.1:{port}', '--workers', '1',
        '--timeout', '120'], tmp_path / 'gunicorn.log', cwd=ROOT).start(env)
    url = f'http://127.0.0.1:{port}'

    def up():
        try:
            return requests.get(url + '/healthz', timeout=1).status_code == 200
        except requests.RequestException:
            return False
    try:
        wait_until(up, timeout=30, interval=0.2, message='gunicorn to answer')
        yield url, child.process
    finally:
        child.kill()  # SIGKILL to its process group: the master and its worker


def children(pid):
    with open(f'/proc/{pid}/task/{pid}/children') as listing:
        return [int(child) for child in listing.read().split()]


def test_killing_an_api_process_mid_request_leaves_no_unqueued_call_and_no_endless_lease(
        gunicorn, make_user, tiny_source, lanes_redis, broker):
    url, master = gunicorn
    user = make_user()
    answers = []

    def call():
        try:
            answers.append(requests.post(
                f'{url}/concepts/$match/?semantic=true', json={'rows': [{'name': 'fever'}],
                                                              'target_repo_url': tiny_source},
                headers={'Authorization': f'Token {user.auth_token.key}', 'Prefer': 'wait=30'}, timeout=60))
        except requests.RequestException as ex:
            answers.append(ex)
    thread = threading.Thread(target=call)
    thread.start()
    task_key = lane_key(Lane.API_HEAVY_TASK, 'api-a')
    # The call is queued and its request is waiting for the result (no worker runs), holding this host's lane.
    wait_until(lambda: lanes_redis.zcard(task_key) == 1 and Work.objects.exists(), timeout=20,
               message=f'the request to wait ({answers and getattr(answers[0], "content", answers[0])})')
    killed_at_ms = lanes_redis.time()[0] * 1000
    for pid in children(master.pid):
        os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert isinstance(answers[0], requests.RequestException) or answers[0].status_code >= 500
    calls = list(Work.objects.all())
    assert len(calls) == 1 and calls[0].state == 'queued'
    assert depth(calls[0].queue) == 1, list(broker.scan_iter('*'))  # recorded as submitted => in the queue
    # The dead request's host lease can't be released by anyone; it ends at its expiry, not never.
    (token, score), = lanes_redis.zrange(task_key, 0, -1, withscores=True)
    assert score <= killed_at_ms + 600_000 + 1_000
    assert lanes_redis.pttl(task_key) > 0
