"""An API process killed (SIGKILL) in the middle of its work, on the real stack (gunicorn, the test's own
redis-server, beat and the sweep): no lease it held outlives it by more than one lease. Before, its
requests' waiting slots stayed taken until the end of the longest wait (605 s) and a call killed before its
row was written held its lanes until the queue deadline (600 s): in enforce mode every heavy call got a 429
for 10 minutes.

- the waiting slots of the requests it held (this host's `api_heavy_task` lane) come back within
  `lease_seconds` plus one renewal: the process renewed them while it lived (capacity.keeper);
- the calls it had recorded stay queued and counted (the sweep renews their leases while they wait), and
  run once a worker comes;
- a call it had admitted but not recorded yet (killed while the database held its write back) leaves no
  row and no message, and its leases come back within lifecycle.queued_lease_ms.
"""
import os
import signal
import sqlite3
import threading
import time

import pytest
import requests
from django.db import connection

from capacity.constants import Lane
from capacity.keys import lane_key
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import ROWS
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
LEASE_SECONDS, RENEW_SECONDS, SWEEP_SECONDS = 15, 5, 1


def children(pid):
    with open(f'/proc/{pid}/task/{pid}/children') as listing:
        return [int(child) for child in listing.read().split()]


def post(url, token, source, rows, answers, **headers):
    try:
        answers.append(requests.post(f'{url}/concepts/$match/?semantic=true',
                                     json={'rows': rows, 'target_repo_url': source},
                                     headers={'Authorization': f'Token {token}', **headers}, timeout=90))
    except requests.RequestException as ex:
        answers.append(ex)


def kill_api(stack):
    """SIGKILL every gunicorn worker process of the stack's API (its master starts new ones, as a container
    runtime restarts a container)."""
    for api in stack.apis:
        for pid in children(api.process.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stack(fault_stack, configure):
    configure(lease_seconds=LEASE_SECONDS, renew_seconds=RENEW_SECONDS, max_hold_seconds=LEASE_SECONDS)
    fault_stack.common.update(WORKERS_SWEEP_SECONDS=SWEEP_SECONDS, WORKERS_SWEEP_GRACE_SECONDS=60)
    return fault_stack


def test_a_killed_api_process_gives_its_waiting_slots_back_and_its_recorded_calls_stay_counted(
        stack, tiny_source, make_user):
    url = stack.api('api-a', threads=16)  # 8 of its threads may wait (API_WAITING_PER_PROCESS)
    stack.maintenance(sweep_seconds=SWEEP_SECONDS, grace_seconds=60)
    token = make_user('core_user').auth_token.key
    answers = []
    waiting = [threading.Thread(target=post, args=(url, token, tiny_source, [{**row, 'n': i} for row in ROWS],
                                                   answers), kwargs={'Prefer': 'wait=60'}) for i in range(3)]
    for thread in waiting:
        thread.start()
    slots = lane_key(Lane.API_HEAVY_TASK, 'api-a')
    lanes = stack.lanes()
    wait_until(lambda: lanes.zcard(slots) == 3 and Work.objects.count() == 3, timeout=30,
               message='three requests waiting on three queued calls')
    held_before = stack.leases() - 3  # the calls' own leases, besides the slots

    kill_api(stack)
    killed = time.monotonic()
    for thread in waiting:
        thread.join(60)
    assert all(isinstance(a, requests.RequestException) or a.status_code >= 500 for a in answers)
    wait_until(lambda: not lanes.zcount(slots, f'({now_ms(lanes)}', '+inf'), timeout=LEASE_SECONDS + 10,
               interval=0.2, message='the dead requests\' waiting slots to come back')
    assert time.monotonic() - killed <= LEASE_SECONDS + RENEW_SECONDS + 2
    # The recorded calls wait on, counted: the sweep renews their leases past their first lease.
    time.sleep(max(0.0, LEASE_SECONDS + SWEEP_SECONDS + 2 - (time.monotonic() - killed)))
    assert Work.objects.filter(state='queued').count() == 3
    assert stack.leases() == held_before
    # ... and run once a worker comes, and give their leases back.
    stack.worker(name='late', queues=('es2_knn',))
    wait_until(lambda: Work.objects.filter(state='succeeded').count() == 3, timeout=90, interval=0.5,
               message='the queued calls to run')
    wait_until(lambda: stack.leases() == 0, timeout=10, interval=0.2, message='no lease left')
    assert set(Work.objects.values_list('attempts', flat=True)) == {1}
    lanes.close()


def now_ms(client):
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


@pytest.mark.parametrize('database', [
    pytest.param('sqlite'), pytest.param('postgres', marks=pytest.mark.postgres)])
def test_a_call_whose_api_process_died_before_writing_it_gives_its_leases_back(
        stack, tiny_source, make_user, database, settings):
    if (settings.DATABASES['default']['ENGINE'] == 'django.db.backends.sqlite3') != (database == 'sqlite'):
        pytest.skip(f'runs in the {database} pass')
    url = stack.api('api-a', threads=8)
    token = make_user('core_user').auth_token.key
    lanes = stack.lanes()
    with held_database_writes():  # its INSERT waits: admitted, its leases taken, nothing written
        answers = []
        thread = threading.Thread(target=post, args=(url, token, tiny_source, ROWS, answers),
                                  kwargs={'Prefer': 'respond-async'})
        thread.start()
        wait_until(lambda: stack.leases() >= 4, timeout=30, message='the call admitted')
        kill_api(stack)
        killed = time.monotonic()
        thread.join(60)
    assert isinstance(answers[0], requests.RequestException) or answers[0].status_code >= 500
    assert Work.objects.count() == 0 and stack.messages() == set()  # nothing was recorded or sent
    wait_until(lambda: stack.leases() == 0, timeout=LEASE_SECONDS + SWEEP_SECONDS + 10, interval=0.2,
               message='the leases of the call that was never written to come back')
    assert time.monotonic() - killed <= LEASE_SECONDS + SWEEP_SECONDS + 2
    # This host takes calls again: the next one is admitted and recorded.
    again = []
    post(url, token, tiny_source, ROWS, again, Prefer='respond-async')
    assert again[0].status_code == 202, again[0].text
    lanes.close()


class held_database_writes:
    """Hold the database's writes from another connection (SQLite: its write lock; PostgreSQL: an exclusive
    lock on the work table), as a slow disk or a long migration would; released on exit."""

    def __enter__(self):
        if connection.vendor == 'sqlite':
            self.other = sqlite3.connect(connection.settings_dict['NAME'], isolation_level=None, timeout=1)
            self.other.execute('BEGIN IMMEDIATE')
        else:
            import psycopg
            params = connection.get_connection_params()
            self.other = psycopg.connect(**{k: v for k, v in params.items() if k != 'cursor_factory'})
            self.other.execute('LOCK TABLE heavy_work IN EXCLUSIVE MODE')
        return self

    def __exit__(self, *exc):
        self.other.rollback() if connection.vendor != 'sqlite' else self.other.execute('ROLLBACK')
        self.other.close()
