"""Running one call's work in a worker, called as a plain function (no broker), on both lane stores: the lease
hand-off (renew at start, retake on redelivery, release at the end), states, duplicates, and fail-open
cases. Each case is delivered twice: as a message that carries the work's worker leases (a first publish)
and as one that doesn't (an older message, or one sent again). On PostgreSQL (test_execution_postgres.py
runs them all there) the first claims the row in one statement without reading it first."""
import os
import time
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from capacity.admission import LEASE_MESSAGE_KEYS
from capacity import gate
from capacity.constants import Lane
from capacity.store import get_store
from tests.integration.workers.conftest import wait_until
from workers import execution, lifecycle
from workers.models import Call, Work

pytestmark = pytest.mark.django_db




@pytest.fixture(params=['message with leases', 'message without'])
def deliver(request):
    """deliver(call_id, **kwargs): execution.run as the task calls it for a message of either form."""
    def deliver(work_id, **kwargs):
        if request.param == 'message with leases':
            lease = Work.objects.filter(pk=work_id).values_list('lease', flat=True).first()
            if lease is not None:
                kwargs['leases'] = {key: lease[key] for key in LEASE_MESSAGE_KEYS}
        return execution.run(work_id, **kwargs)
    return deliver


@pytest.fixture
def lines():
    with mock.patch('workers.lifecycle.reads.emit') as emit, mock.patch('workers.celery.app.control.revoke'):
        yield emit


def admitted(user, queue='es2_knn', **changes):
    """The work of a call admitted by the gate and recorded as the API records it (without publishing)."""
    admission = gate.admit(user, endpoint='$match', rows=2, semantic=True, queue=queue, draws_on=Lane.ES2_KNN)
    work = Work(**{**{'id': admission.token, 'endpoint': '$match', 'queue': queue, 'semantic': True, 'rows': 2,
                          'payload': {'rows': []}, 'expires_at': timezone.now() + timedelta(minutes=10),
                          'lease': {**admission.worker_lease_message(), 'limits': admission.worker_limits()}},
                   **changes})
    call = Call(id=admission.token, owner=user, endpoint='$match', rows=2, fingerprint='f',
                admission=admission.to_json())
    return lifecycle.enqueue(work, call, publish=mock.Mock()).work


def keys(work):
    return work.lease['keys']


def result(work):
    return lifecycle.result(Call.objects.get(pk=work.pk))


def first_call(work_id):
    return Call.objects.select_related('work').get(pk=work_id)


def scores(client, call):
    return [client.zscore(key, call.pk) for key in keys(call)]


def now_ms(client):
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_a_call_renews_its_queued_leases_runs_and_releases_them(deliver, make_user, lanes, lines):
    call = admitted(make_user())
    assert min(scores(lanes, call)) > now_ms(lanes) + 500_000  # queued: until the queue deadline
    seen = {}

    def perform(row):
        seen['scores'] = scores(lanes, row)
        seen['state'] = Work.objects.get(pk=row.pk).state
        return {'ok': True}
    assert deliver(call.pk, perform=perform, node='w@h') == {'ok': True}
    assert seen['state'] == 'running'
    assert max(seen['scores']) < now_ms(lanes) + 61_000  # renewed by lease_seconds at start
    assert scores(lanes, call) == [None] * len(keys(call))  # released
    call.refresh_from_db()
    assert result(call) == {'ok': True}
    assert call.state == 'succeeded' and call.attempts == 1 and call.worker.startswith('w@h pid ')
    line = lines.call_args.args[0]
    assert (line['state'], line['queue'], line['task_id'], line['attempts']) == ('succeeded', 'es2_knn', call.pk, 1)
    assert line['run_ms'] >= 0 and line['wait_ms'] >= 0 and line['lease_lost'] is None


def test_a_run_logs_its_start_by_the_databases_clock_and_how_long_it_ran(deliver, make_user, lanes, lines,
                                                                          caplog):
    # docs/cluster.md judges "no work runs twice at once" by these two lines of every run
    call = admitted(make_user())
    caplog.set_level('INFO', logger='heavy_lanes')

    def perform(row):
        time.sleep(0.2)  # the run itself: the seconds the end line must cover
        return {'ok': True}
    deliver(call.pk, perform=perform, node='w@h')
    runs = [record.run for record in caplog.records if hasattr(record, 'run')]
    call.refresh_from_db()
    started = {'work': call.pk, 'attempt': 1, 'worker': call.worker, 'started': call.started_at.isoformat()}
    assert runs[0] == started
    assert runs[1] == {**started, 'seconds': runs[1]['seconds']} and 0.2 <= runs[1]['seconds'] < 5
    assert len(runs) == 2


def test_a_run_a_cancel_stops_still_logs_its_end(deliver, make_user, lanes, lines, caplog):
    call = admitted(make_user())
    caplog.set_level('INFO', logger='heavy_lanes')

    def perform(row):
        raise execution.CallStopped()
    assert deliver(call.pk, perform=perform, node='w@h') is None
    assert [sorted(record.run) for record in caplog.records if hasattr(record, 'run')] == [
        ['attempt', 'started', 'work', 'worker'], ['attempt', 'seconds', 'started', 'work', 'worker']]


def test_a_runs_end_releases_and_announces_in_one_round_trip(deliver, make_user, lanes, lines):
    from workers import notify
    call = admitted(make_user())
    store = get_store()
    with mock.patch.object(store, 'release', wraps=store.release) as release, \
            mock.patch.object(store, 'release_and_end', wraps=store.release_and_end) as together, \
            mock.patch.object(notify, 'publish') as publish_alone:
        deliver(call.pk, perform=lambda row: {'ok': True}, node='w@h')
    release.assert_not_called()
    publish_alone.assert_not_called()
    (released, token), sent = together.call_args
    assert sorted(released) == sorted(keys(call)) and token == call.pk
    channel, message = sent['notice']
    assert channel == notify.channel(call.pk) and message == 'succeeded\n{"ok": true}'
    assert scores(lanes, call) == [None] * len(keys(call))


def test_a_runs_end_goes_to_the_process_its_message_names_and_to_every_process_when_none_heard_it(
        deliver, make_user, lanes, lines):
    """A message that names an API process's notice channel has its end announced there, result and all,
    in the end's one round trip; when no process heard it (that process is gone), a bare notice follows on
    the work's channel, which every process hears (a long poll elsewhere)."""
    from workers import notify
    call = admitted(make_user())
    store = get_store()
    gone = 'heavy-lanes:notices-to:gone-host:1:00000000'
    with mock.patch.object(store, 'release_and_end', wraps=store.release_and_end) as together, \
            mock.patch.object(notify, 'publish') as publish_alone:
        deliver(call.pk, perform=lambda row: {'ok': True}, node='w@h', notice_to=gone)
    assert together.call_args.kwargs['notice'] == (gone, f'{call.pk}\nsucceeded\n{{"ok": true}}')
    publish_alone.assert_called_once_with(call.pk, 'succeeded')


def test_a_failing_call_is_failed_refunded_and_releases_its_leases(deliver, make_user, lanes, lines):
    call = admitted(make_user())
    with pytest.raises(ValueError):
        deliver(call.pk, perform=mock.Mock(side_effect=ValueError('no such source')))
    call.refresh_from_db()
    assert call.state == 'failed' and call.error == 'ValueError: no such source'
    assert scores(lanes, call) == [None] * len(keys(call))
    assert lines.call_args.args[0]['state'] == 'failed'


def test_the_workers_release_measures_the_leases_hold_and_the_queues_run_time(
        deliver, make_user, lanes, lines):
    call = admitted(make_user())

    def perform(row):
        time.sleep(0.2)
        return {'ok': True}
    deliver(call.pk, perform=perform, node='w@h')
    holds = get_store().holds()
    assert 200 <= holds['run:es2_knn'] < 2000  # the run, timed by the worker
    # Each lane held it from the API's acquire to the worker's release: at least the run.
    assert {'api_heavy', 'es2_knn', 'user'} <= set(holds)
    assert all(holds[field] >= holds['run:es2_knn'] for field in ('api_heavy', 'es2_knn', 'user'))


def test_a_cancelled_run_is_not_measured_as_a_run(deliver, make_user, lanes, lines):
    call = admitted(make_user())

    def perform(row):
        lifecycle.cancel(first_call(row.pk))
        return {'ok': True}
    deliver(call.pk, perform=perform, node='w@h')
    assert 'run:es2_knn' not in get_store().holds()


def test_a_cancelled_call_never_runs(deliver, make_user, lanes):
    call = admitted(make_user(), state='cancelled')
    perform = mock.Mock()
    assert deliver(call.pk, perform=perform) is None
    perform.assert_not_called()


def test_a_call_past_its_queue_deadline_expires_unrun_and_frees_its_leases(deliver, make_user, lanes, lines):
    call = admitted(make_user())
    Work.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    perform = mock.Mock()
    assert deliver(call.pk, perform=perform) is None
    perform.assert_not_called()
    call.refresh_from_db()
    assert call.state == 'expired' and call.started_at is None
    assert scores(lanes, call) == [None] * len(keys(call))
    assert lines.call_args.args[0]['state'] == 'expired'


def test_a_redelivered_call_whose_leases_expired_takes_them_again(deliver, make_user, lanes):
    call = admitted(make_user(), state='running', attempts=1)
    for key in keys(call):
        lanes.zadd(key, {call.pk: 1000})  # its worker died long ago
    seen = {}
    deliver(call.pk, perform=lambda row: seen.setdefault('scores', scores(lanes, row)))
    assert min(seen['scores']) > now_ms(lanes)  # counted again while it runs
    call.refresh_from_db()
    assert call.attempts == 2 and not call.lease_lost


def test_a_first_delivery_whose_leases_are_gone_runs_uncounted_and_says_so(deliver, make_user, lanes, lines):
    call = admitted(make_user())
    for key in keys(call):
        lanes.zrem(key, call.pk)
    perform = mock.Mock(return_value={})
    deliver(call.pk, perform=perform)
    perform.assert_called_once()
    assert all(score is None for score in scores(lanes, call))  # never revived
    call.refresh_from_db()
    assert call.lease_lost and call.state == 'succeeded'
    assert lines.call_args.args[0]['lease_lost'] is True


def test_a_renewer_that_fails_to_start_still_runs_and_releases(deliver, make_user, lanes):
    call = admitted(make_user())
    with mock.patch.object(execution.BEATS, 'start', side_effect=RuntimeError("can't start new thread")):
        assert deliver(call.pk, perform=lambda row: 'done') == 'done'
    assert scores(lanes, call) == [None] * len(keys(call))
    call.refresh_from_db()
    assert call.limiter_error == "RuntimeError: can't start new thread"


def test_a_failing_log_line_never_fails_the_call(deliver, make_user, lanes):
    call = admitted(make_user())
    with mock.patch('workers.lifecycle.reads.emit', side_effect=OSError('stdout is gone')) as emit:
        assert deliver(call.pk, perform=lambda row: {}) == {}
    emit.assert_called_once()
    assert Work.objects.get(pk=call.pk).state == 'succeeded'


def test_a_message_whose_row_never_commits_is_dropped(deliver, make_user, lanes, monkeypatch):
    monkeypatch.setattr(lifecycle.running, 'ROW_WAIT_SECONDS', 0.1)
    perform = mock.Mock()
    assert deliver('0' * 32, perform=perform) is None
    perform.assert_not_called()


def test_a_delivery_of_a_call_running_on_a_live_worker_doesnt_run_it_and_looks_again_later(
        deliver, make_user, lanes):
    call = admitted(make_user(), state='running', attempts=1, worker='other@node pid 1',
                    heartbeat_at=timezone.now() - timedelta(seconds=20))
    perform = mock.Mock()
    with pytest.raises(execution.Busy) as busy:
        deliver(call.pk, perform=perform, node='w@h')
    assert 40 <= busy.value.retry_in <= 42  # just after its heartbeat (20 s old) goes stale at 60 s
    perform.assert_not_called()
    call.refresh_from_db()
    assert call.state == 'running' and call.attempts == 1 and call.worker == 'other@node pid 1'
    assert all(scores(lanes, call))  # the live run's leases are untouched


def test_a_delivery_takes_over_a_call_whose_worker_process_is_gone(deliver, make_user, lanes):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a pid that no longer exists, on this node
    call = admitted(make_user(), state='running', attempts=1, worker=f'w@h pid {dead}',
                    heartbeat_at=timezone.now())
    assert deliver(call.pk, perform=lambda row: 'again', node='w@h') == 'again'
    call.refresh_from_db()
    assert call.state == 'succeeded' and call.attempts == 2


def test_a_cancel_while_it_runs_keeps_no_result_and_releases_the_leases_once_it_stopped(
        deliver, make_user, lanes, lines):
    call = admitted(make_user())
    seen = {}

    def perform(row):
        assert lifecycle.cancel(first_call(row.pk)) == 'running'
        seen['scores'] = scores(lanes, row)  # cancelled, still running: its leases are still held
        return {'late': True}
    assert deliver(call.pk, perform=perform, node='w@h') == {'late': True}
    assert all(seen['scores'])
    call.refresh_from_db()
    assert call.state == 'cancelled' and result(call) is None
    assert scores(lanes, call) == [None] * len(keys(call))
    assert lines.call_args.args[0]['state'] == 'cancelled'


def test_an_error_the_cancel_caused_ends_the_run_quietly_as_a_stop(deliver, make_user, lanes, lines):
    # The cancel's SIGTERM raises SystemExit in the pool process, and an import under way turns it into
    # ImportError: the run stops as cancelled, and the task returns instead of reporting a failure.
    call = admitted(make_user())

    def perform(row):
        assert lifecycle.cancel(first_call(row.pk)) == 'running'
        raise ImportError('initialization failed')
    assert deliver(call.pk, perform=perform, node='w@h') is None
    call.refresh_from_db()
    assert (call.state, call.error, call.heartbeat_at) == ('cancelled', '', None)
    assert scores(lanes, call) == [None] * len(keys(call))
    assert lines.call_args.args[0]['state'] == 'cancelled'


def test_a_cancels_signal_an_import_swallowed_still_ends_the_process_after_the_stop(
        deliver, make_user, lanes, lines):
    # billiard's SIGTERM handler raised SystemExit inside an import of a C extension, which turned it into
    # ImportError: the process must not live on with the module half registered.
    call = admitted(make_user())

    def perform(row):
        assert lifecycle.cancel(first_call(row.pk)) == 'running'
        try:
            raise SystemExit(-241)
        except SystemExit as ex:
            raise ImportError('initialization failed') from ex
    with pytest.raises(SystemExit):
        deliver(call.pk, perform=perform, node='w@h')
    call.refresh_from_db()
    assert (call.state, call.error, call.heartbeat_at) == ('cancelled', '', None)
    assert scores(lanes, call) == [None] * len(keys(call))


@pytest.mark.django_db(transaction=True)  # the heartbeat and the canceller are threads of their own
def test_a_cancel_whose_revoke_never_reached_the_worker_stops_the_work_at_its_next_heartbeat(
        deliver, make_user, lanes, lines, settings):
    import threading
    import time

    from django.db import connection
    settings.WORKERS_HEARTBEAT_SECONDS = 0.05
    call = admitted(make_user())
    progress = {'steps': 0}

    def cancel(call_id):  # on a thread of its own, with its own database connection: closed after
        try:
            lifecycle.cancel(first_call(call_id))
        finally:
            connection.close()

    def perform(row):
        threading.Timer(0.1, cancel, args=[row.pk]).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # work that never looks at the row itself
            progress['steps'] += 1
            time.sleep(0.01)
        return {'ran': 'to the end'}
    started = time.monotonic()
    assert deliver(call.pk, perform=perform, node='w@h') is None
    assert time.monotonic() - started < 2  # stopped at a heartbeat, not after its 10 s
    call.refresh_from_db()
    assert call.state == 'cancelled' and call.heartbeat_at is None and result(call) is None
    assert scores(lanes, call) == [None] * len(keys(call))
    assert lines.call_args.args[0]['state'] == 'cancelled'


def test_an_end_the_database_refuses_for_a_moment_is_recorded_once_it_takes_it_without_a_second_run(
        deliver, make_user, lanes, lines, monkeypatch):
    """A restart or a read-only spell of the database as a work ends: the result, kept in memory, is
    recorded when the database takes writes again, instead of the task sending its message again and the
    next delivery computing it a second time."""
    from django.db import OperationalError
    monkeypatch.setattr(execution, 'RECORD_PAUSE_SECONDS', (0.01, 0.05))
    call = admitted(make_user())
    real = lifecycle.succeed
    refusals = []

    def read_only_for_a_moment(*args, **kwargs):
        if len(refusals) < 3:
            refusals.append(1)
            raise OperationalError('cannot execute UPDATE in a read-only transaction')
        return real(*args, **kwargs)
    runs = []
    with mock.patch.object(lifecycle, 'succeed', side_effect=read_only_for_a_moment):
        assert deliver(call.pk, perform=lambda row: runs.append(1) or {'n': 1}) == {'n': 1}
    work = Work.objects.get(pk=call.pk)
    assert (work.state, work.attempts, len(runs), len(refusals)) == ('succeeded', 1, 1, 3)
    assert result(work) == {'n': 1} and scores(lanes, call) == [None] * len(keys(call))


def test_a_call_whose_end_cant_be_recorded_stops_its_heartbeat(deliver, make_user, lanes, lines, monkeypatch):
    # The database refused the end for longer than the worker waits (the task sends its message again): no
    # heartbeat may go on beating the row for a run that is over, or every later delivery waits for a live
    # worker until max_hold_seconds.
    from django.db import OperationalError
    monkeypatch.setattr(execution, 'RECORD_PAUSE_SECONDS', (0.01, 0.05))
    monkeypatch.setattr(execution, 'RECORD_PATIENCE_SECONDS', 0.2)
    call = admitted(make_user())
    heartbeats = []
    real = execution.start_heartbeat

    def spy(*args, **kwargs):
        heartbeats.append(real(*args, **kwargs))
        return heartbeats[-1]
    with mock.patch.object(execution, 'start_heartbeat', spy), \
            mock.patch.object(lifecycle, 'succeed', side_effect=OperationalError('the connection is closed')):
        with pytest.raises(OperationalError):
            deliver(call.pk, perform=lambda row: {})
    assert heartbeats[0].finished.is_set()  # stopped: its loop returns at its next tick...
    wait_until(execution.BEATS.idle, timeout=2, interval=0.01, message='the heartbeat loop to return')
    assert Work.objects.get(pk=call.pk).state == 'running'  # for the delivery that takes it over
