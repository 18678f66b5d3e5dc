"""DELETE racing a call's start, 144 times, on the real stack (gunicorn, a prefork lane worker with a pool of
two, the test's own redis-server): small calls, each cancelled a varied moment after its 202 or just as a
worker picks it up. Whatever the moment, once the cancel answers `cancelled` the work never completes
with a stored result: a call cancelled while queued never starts, and one cancelled while it ran keeps
its leases, and its row says it runs, until the pool process running it has exited or returned from it
(a process returning on its own as the cancel's terminate signal reaches it dies instead: gone at once).
No lease is left at the end, no call runs twice, and nothing is left on the broker: now and then the pool
hands a call to the process a cancel is terminating, and that delivery is lost (the call stays queued, its
message taken and never acknowledged); the sweep sends it again and takes the lost entry off."""
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime

import pytest
import requests
from requests.adapters import HTTPAdapter
from urllib3.util import Retry
from django.db import connection
from django_celery_results.models import TaskResult

from capacity.constants import Lane
from capacity.keys import lane_key
from tests.integration.calls import distinct
from tests.integration.faults.load import FINAL, capacity_lines
from tests.integration.workers.conftest import wait_until
from tests.integration.workers.test_queue import LONG_ROWS
from workers.execution import LOG_DRAIN_SECONDS
from workers.models import Work

pytestmark = [pytest.mark.slow, pytest.mark.redis]
CLIENTS = 4
ROUNDS = 36  # per client: 144 races (the delays in turn, 3 times each per client)
GRACE_SECONDS = 3  # the sweep's: a delivery taken and not started for longer was lost
DELAYS = (0, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.1, 0.2, 0.4)  # s, one a round in turn
# A cancelled call's run that stopped its own work releases its leases and marks the row stopped
# (heartbeat_at cleared) a moment before its process returns from the task: longer than this between
# either and the return, and they came while the work still ran.
STOP_GAP_SECONDS = 0.5
# A process the terminate signal met in its end (workers.execution.terminate_deferred) writes out its log
# lines (up to LOG_DRAIN_SECONDS) before it takes the signal: it is gone within this after the stop.
GONE_SECONDS = LOG_DRAIN_SECONDS + STOP_GAP_SECONDS
# Rows per call: enough work (tens of ms on warm pool processes) that cancels meet calls running.
ROWS = LONG_ROWS[:60]


@dataclass
class Race:
    call_id: str
    delay: float
    status: int = 0
    body: dict | None = None
    lease_at_answer: bool | None = None
    row_at_answer: dict | None = None
    released_before_stop: float = 0.0  # the longest the leases were seen gone while the row said it ran
    stopped_at: float | None = None  # when the row first said no worker runs it any more (epoch seconds)
    pid: int | None = None  # the pool process that ran it
    alive_at_stop: bool | None = None  # that process was still there then
    gone_after: float | None = None  # seconds after the stop when that process was seen gone (killed)


def row_of(call_id):
    fields = ('state', 'attempts', 'started_at', 'heartbeat_at', 'worker')
    return Work.objects.filter(pk=call_id).values(*fields).first()


def alive(pid):
    """Whether the process `pid` exists and hasn't exited (a zombie has)."""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def returns(worker):
    """{call id: [(epoch seconds, pid)]}: when a pool process returned from a delivery of the call."""
    found = {}
    for text in worker.output().splitlines():
        if text.startswith('{') and '"celery.app.trace"' in text and 'run_heavy_call[' in text:
            record = json.loads(text)
            if ' succeeded in ' in record['message']:
                at = datetime.fromisoformat(record['time'].replace('Z', '+00:00')).timestamp()
                found.setdefault(record['data']['id'], []).append((at, record['process']))
    return found


def started_work(row):
    """The row says a worker claimed the call and hasn't confirmed its work stopped."""
    return row['attempts'] > 0 and row['heartbeat_at'] is not None


def test_a_delete_racing_the_start_never_lets_the_work_complete_or_its_leases_go_early(
        fault_stack, configure, tiny_source, make_user):
    configure(cache={'ttl_seconds': 0}, lease_seconds=15, renew_seconds=5,
              per_user={'staff': 40, 'core': 40, 'early_access': 40, 'preview': 40},
              tiers={'staff': 40, 'core': 40, 'early_access': 40, 'preview': 40})
    url = fault_stack.api(threads=16)
    worker = fault_stack.worker(name='knn', queues=('es2_knn',))
    maintenance = fault_stack.maintenance(sweep_seconds=1, grace_seconds=GRACE_SECONDS)
    wait_until(lambda: (fault_stack.status()['queues']['es2_knn']['workers'].get(worker.node) or {}).get(
        'processes') == 2, timeout=30, interval=0.2, message='a pool of two')
    users = [make_user() for _ in range(CLIENTS)]
    races, errors = [], []
    lanes = fault_stack.lanes()
    es2_knn = lane_key(Lane.ES2_KNN)

    def cancel(session, headers, race):
        """DELETE the call, and while the cancel goes on and until the work has stopped, look again and
        again at its lease, then its row: the lease gone while the row says a cancelled call's work still
        runs is a release before the stop. When the row first says the work stopped, note whether the
        pool process that ran it is still there (then it must return from the call right away)."""
        answers = []

        def send():
            try:
                answers.append(session.delete(f'{url}/tasks/{race.call_id}/', headers=headers, timeout=30))
            except Exception as ex:  # noqa: BLE001 - raised below, in the client's thread, with the call named
                answers.append(ex)

        sender = threading.Thread(target=send)
        sender.start()
        gone_since = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answered = bool(answers)
            held = lanes.zscore(es2_knn, race.call_id) is not None
            row = row_of(race.call_id)
            now = time.monotonic()
            if answered and race.lease_at_answer is None:
                race.lease_at_answer, race.row_at_answer = held, row
            if not held and row['state'] == 'cancelled' and started_work(row):
                gone_since = gone_since or now
                race.released_before_stop = max(race.released_before_stop, now - gone_since)
            else:
                gone_since = None
            says_stopped = row['state'] == 'cancelled' and row['attempts'] and not started_work(row)
            if race.stopped_at is None and says_stopped:
                race.stopped_at, race.pid = time.time(), int(row['worker'].rsplit(' ', 1)[1])
                race.alive_at_stop = alive(race.pid)
                # The cancel's terminate signal may meet a process that is returning from the call on its
                # own: it then dies instead of returning. Either way it stopped; see when it went.
                while race.alive_at_stop and time.time() - race.stopped_at < GONE_SECONDS:
                    if not alive(race.pid):
                        race.gone_after = time.time() - race.stopped_at
                        break
                    time.sleep(0.002)
            if answered and not (row['state'] == 'cancelled' and started_work(row)):
                break
            time.sleep(0.002)
        sender.join(30)
        assert answers, f'the DELETE of {race.call_id} had no answer in 30 s'
        if isinstance(answers[0], Exception):
            raise AssertionError(f'the DELETE of {race.call_id} failed: {answers[0]!r}')
        race.status, race.body = answers[0].status_code, answers[0].json()

    def client(index):
        session = requests.Session()
        # A kept-alive connection the server closes (gunicorn's keepalive, 5 s) just as a request goes out
        # fails that request: sent again on a new connection, as a client does. Safe for every request here:
        # DELETE is idempotent and each POST carries its Idempotency-Key.
        session.mount(url, HTTPAdapter(max_retries=Retry(total=2, connect=2, read=2, status=0,
                                                         allowed_methods=None, raise_on_status=False)))
        headers = {'Authorization': f'Token {users[index].auth_token.key}'}
        try:
            for round_ in range(ROUNDS):
                response = session.post(f'{url}/concepts/$match/?semantic=true', json={
                    'rows': distinct(ROWS), 'target_repo_url': tiny_source},
                    headers={**headers, 'Prefer': 'respond-async', 'Idempotency-Key': f'race-{index}-{round_}'},
                    timeout=30)
                assert response.status_code == 202, response.content
                race = Race(response.json()['id'], delay=DELAYS[(round_ + index) % len(DELAYS)])
                if round_ % 2:  # just as a worker picks it up (or a moment later)
                    deadline = time.monotonic() + 5
                    while row_of(race.call_id)['state'] == 'queued' and time.monotonic() < deadline:
                        time.sleep(0.001)
                time.sleep(race.delay)
                cancel(session, headers, race)
                races.append(race)
        except Exception as ex:  # noqa: BLE001 - reported by the test
            errors.append(ex)
        finally:
            session.close()
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert not errors, errors
    assert len(races) == CLIENTS * ROUNDS

    ids = [race.call_id for race in races]
    wait_until(lambda: not Work.objects.filter(pk__in=ids).exclude(state__in=FINAL).exists(), timeout=60,
               message='every call to end')
    # Nothing is left on the broker: a delivery the pool lost is sent again or, its call ended, taken off.
    wait_until(lambda: not fault_stack.messages(), timeout=GRACE_SECONDS + 30, interval=0.5,
               message=f'every message handled: {fault_stack.messages()}')
    wait_until(lambda: fault_stack.leases() == 0, timeout=10,
               message=f'no lease left: {fault_stack.lease_members()}')

    cancelled = [race for race in races if race.status == 200]
    assert {race.status for race in races} <= {200, 409}
    assert all(race.body['state'] == 'cancelled' for race in cancelled)
    from_queue = [race for race in cancelled if race.body['started_at'] is None]
    from_running = [race for race in cancelled if race.body['started_at'] is not None]
    # The race was run: cancels met calls still waiting and calls already running.
    assert len(from_queue) >= 10 and len(from_running) >= 10, (len(from_queue), len(from_running))

    calls = {call.pk: call for call in Work.objects.filter(pk__in=ids)}
    # What a poll would show as its result (Celery itself records REVOKED for a message it discarded).
    stored = TaskResult.objects.filter(task_id__in=ids)
    results = set(stored.filter(status='SUCCESS').values_list('task_id', flat=True))
    assert set(stored.values_list('status', flat=True)) <= {'SUCCESS', 'REVOKED'}
    for race in cancelled:
        call = calls[race.call_id]
        assert call.state == 'cancelled', race
        assert race.call_id not in results, race  # its work never completed with a stored result
        assert call.heartbeat_at is None, race  # no worker runs it
    for race in from_queue:
        # Cancelled while queued: its leases went back at once, and no worker ever claimed it.
        assert not race.lease_at_answer, race
        assert (calls[race.call_id].attempts, calls[race.call_id].started_at) == (0, None), race
    ran = returns(worker)
    for race in from_running:
        # Cancelled while it ran: its leases went back, and the row said it stopped, only once its worker
        # had stopped the work: its process was gone, or returned from it right after.
        assert race.released_before_stop < STOP_GAP_SECONDS, race
        assert calls[race.call_id].attempts == 1, race
        if race.alive_at_stop and race.gone_after is None:
            assert any(pid == race.pid and race.stopped_at - 1 <= at <= race.stopped_at + STOP_GAP_SECONDS
                       for at, pid in ran.get(race.call_id, ())), (race, ran.get(race.call_id))
    # A call the cancel missed (it had ended) ran once, to its result.
    for race in races:
        if race.status == 409:
            assert (calls[race.call_id].state, calls[race.call_id].attempts) == ('succeeded', 1), race
            assert race.call_id in results
    ends = {}
    for line in capacity_lines([worker, maintenance, *fault_stack.apis]):
        if line.get('task_id') in calls and line.get('state') in FINAL:
            ends[line['task_id']] = ends.get(line['task_id'], 0) + 1
    assert ends == dict.fromkeys(calls, 1)
    lanes.close()
