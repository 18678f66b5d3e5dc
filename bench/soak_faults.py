"""The soak's faults that take more than a signal (bench/soak.py): a Redis stall, a read-only database, a
call's message pushed again, an acknowledgement dropped, a flushed broker, and DELETEs racing calls' start.
Each returns (or fills in) a dict of what it did, for the report."""
import os
import signal
import threading
import time
import uuid

from stack import DB_NAME, _admin

OWN_APPLICATION = 'heavy-lanes-soak'  # the soak's own database sessions: a fault leaves them alone
RACE_DELAYS = (0, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1)  # s after the 202, one a race in turn


def stall(servers, seconds, before=None, after=None):
    """SIGSTOP the redis-servers {name: pid} for `seconds`, then SIGCONT; returns the monotonic times
    (stopped, resumed). `before`/`after` run just around it (the sampler's skip flag)."""
    if before:
        before()
    try:
        for pid in servers.values():
            os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(seconds)
    finally:
        for pid in servers.values():
            os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    if after:
        after()
    return stopped, resumed


def read_only_database(seconds):
    """The stack's PostgreSQL database takes only reads for `seconds`, as a server demoted to a standby
    would: `default_transaction_read_only` for the database, and every session of it but the soak's own
    ended so that each process reconnects into it; afterwards the setting is reset and the read-only
    sessions are ended the same way. Returns (start, end) in monotonic time and the sessions ended."""
    ended = []
    _admin(f'ALTER DATABASE {DB_NAME} SET default_transaction_read_only = on')
    start = time.monotonic()
    ended.append(terminate_sessions())
    try:
        time.sleep(seconds)
    finally:
        _admin(f'ALTER DATABASE {DB_NAME} RESET default_transaction_read_only')
        end = time.monotonic()
        ended.append(terminate_sessions())
    return start, end, ended


def terminate_sessions():
    import psycopg
    from stack import PG_ADMIN_URL
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as connection:
        rows = connection.execute(
            'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() '
            'AND application_name <> %s', (DB_NAME, OWN_APPLICATION)).fetchall()
    return len(rows)


def own_sessions_named():
    """Name this process's database sessions (OWN_APPLICATION) from now on, so the read-only fault spares
    them: the soak reads the rows throughout."""
    from django.db import connections
    connections.settings['default'].setdefault('OPTIONS', {})['application_name'] = OWN_APPLICATION
    connections.close_all()


def duplicate_running(broker, queue_of_call, running_call, timeout=8.0):
    """Push a copy of a running call's taken message onto its queue; returns what was done. A quick call
    can end (and its message be acknowledged) before its message is read: then another running call."""
    from tests.integration.faults.inject import push_copy, taken_entry
    deadline = time.monotonic() + timeout
    missed = []
    while time.monotonic() < deadline:
        call, _ = running_call(timeout=max(0.1, deadline - time.monotonic()))
        if call is None:
            break
        raw = taken_entry(broker, call.pk)
        if raw is not None:
            push_copy(broker, raw, queue_of_call(call))
            return {'call': call.pk, 'lane': call.queue, 'worker': call.worker, 'ended_first': len(missed)}
        missed.append(call.pk)
        time.sleep(0.02)
    return {'call': None, 'note': f'no running call whose message was in unacked in {timeout:g} s '
                                  f'({len(missed)} ended first)'}


def drop_ack(broker_pid, running_call, log_of, finished, timeout=25.0):
    """Stop the broker Redis while a running call ends, so that its worker's acknowledgement times out
    (Couldn't ack), as in tests/integration/faults/test_lost_ack.py; resume it once the worker said so.
    Returns what was done, with the stall's (stopped, resumed) monotonic times."""
    call, _ = running_call(timeout=8.0)
    if call is None:
        return {'call': None, 'note': 'no running call found in 8 s'}
    log = log_of(call)
    before = log.read_text(errors='replace').count("Couldn't ack") if log else 0
    os.kill(broker_pid, signal.SIGSTOP)
    stopped = time.monotonic()
    seen = False
    try:
        deadline = stopped + timeout
        while time.monotonic() < deadline:
            if finished(call.pk) and log is not None:
                text = log.read_text(errors='replace')
                if text.count("Couldn't ack") > before or 'acknowledgement failed' in text:
                    seen = True
                    break
            time.sleep(0.1)
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    resumed = time.monotonic()
    return {'call': call.pk, 'lane': call.queue, 'worker': call.worker, 'ack_lost': seen,
            'log': log.name if log else None, 'stall': (stopped, resumed)}


def flush_broker(broker, queued_calls, timeout=8.0):
    """FLUSHDB the broker while calls wait on its lists (waits up to `timeout` for one); returns the ids
    of the calls that were queued then (their messages are gone: the sweep must send them again or expire
    them)."""
    from workers import messages
    from workers.lanes import QUEUE_NAMES
    deadline = time.monotonic() + timeout
    waiting = 0
    while time.monotonic() < deadline:
        waiting = sum(messages.depth(queue, broker) for queue in QUEUE_NAMES)
        if waiting:
            break
        time.sleep(0.02)
    queued = queued_calls()
    broker.flushdb()
    return {'waiting_messages': waiting, 'queued_calls': queued}


class CancelRace(threading.Thread):
    """Submit a small bulk call and DELETE it at once (a varied moment after its 202, or just as a worker
    picks it up), again and again until stopped, alternating the API servers. `races` holds each one:
    {call, key, delay, status (of the DELETE), body state, started_at}."""

    def __init__(self, urls, token, source, names):
        super().__init__(name='soak-cancel-race', daemon=True)
        self.urls, self.token, self.source, self.names = urls, token, source, names
        self.stopping = threading.Event()
        self.races, self.submissions, self.errors = [], [], []

    def stop(self):
        self.stopping.set()
        self.join(60)

    def run(self):
        import requests
        from django.db import connection

        from workers.models import Work
        session = requests.Session()
        session.headers['Authorization'] = f'Token {self.token}'
        number = 0
        try:
            while not self.stopping.is_set():
                url = self.urls[number % len(self.urls)]
                delay = RACE_DELAYS[number % len(RACE_DELAYS)]
                number += 1
                key = f'race-{uuid.uuid4().hex}'
                rows = [{'name': self.names[(number + i) % len(self.names)]} for i in range(2)] + [{'name': key}]
                sent = time.monotonic()
                try:
                    response = session.post(f'{url}/concepts/$match/', params={'semantic': 'true', 'limit': '5'},
                                            json={'rows': rows, 'target_repo_url': self.source},
                                            headers={'Prefer': 'respond-async', 'Idempotency-Key': key}, timeout=30)
                except requests.RequestException as ex:
                    self.errors.append(f'POST {type(ex).__name__}')
                    self.stopping.wait(0.5)
                    continue
                self.submissions.append({'key': key, 'status': response.status_code, 'sent': sent,
                                         'took': time.monotonic() - sent})
                if response.status_code != 202:
                    self.stopping.wait(0.1 if response.status_code == 429 else 1.0)
                    continue
                call_id = response.json()['id']
                if number % 2:  # just as a worker picks it up (or a moment later)
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline and Work.objects.filter(
                            pk=call_id, state='queued').exists():
                        time.sleep(0.002)
                time.sleep(delay)
                race = {'call': call_id, 'key': key, 'delay': delay, 'url': url}
                try:
                    answer = session.delete(f'{url}/tasks/{call_id}/', timeout=30)
                    race['status'] = answer.status_code
                    json_body = answer.headers.get('Content-Type', '').startswith('application/json')
                    body = answer.json() if json_body else {}
                    race['state'], race['started_at'] = body.get('state'), body.get('started_at')
                except (requests.RequestException, ValueError) as ex:
                    race['status'], race['error'] = None, f'{type(ex).__name__}: {ex}'[:200]
                self.races.append(race)
        except Exception as ex:  # noqa: BLE001 - reported as a failed check
            self.errors.append(f'{type(ex).__name__}: {ex}')
        finally:
            session.close()
            connection.close()


def api_processes(stack):
    """The pids of every API server's gunicorn worker processes (the children of each master)."""
    pids = []
    for name, child in stack.children.items():
        if name == 'api' or name.startswith('api-'):
            with open(f'/proc/{child.pid}/task/{child.pid}/children') as listing:
                pids += [int(pid) for pid in listing.read().split()]
    return pids


def starve_apis(stack, seconds, rel):
    """SIGSTOP every API process for `seconds` (longer than the limiter's deadline) while Redis answers, as a
    host that gives them no CPU; the calls they had sent must find Redis's answers and count."""
    pids = api_processes(stack)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    return {'t': rel(stopped), 'seconds': seconds, 'processes': len(pids)}
