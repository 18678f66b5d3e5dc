"""Running one call in a worker, called as a plain function (no broker), on both lane stores: the lease
hand-off (renew at start, retake on redelivery, release at the end), states, and fail-open cases."""
import json
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone
from django_celery_results.models import TaskResult

from capacity.config import clear_cache
from capacity.gate import CapacityGate
from capacity.store import RedisLanes
from workers import execution, submission
from workers.models import HeavyCall

pytestmark = pytest.mark.django_db


@pytest.fixture
def lanes(redis_client):
    RedisLanes.use_client(redis_client)
    clear_cache()
    yield redis_client
    RedisLanes.use_client(None)
    clear_cache()


@pytest.fixture
def lines():
    with mock.patch('workers.execution.emit') as emit:
        yield emit


def admitted(user, queue='es2_knn', **changes):
    """A call admitted by the gate and recorded as the API records it (without publishing)."""
    gate = CapacityGate(user, '$match', rows=2, semantic=True, queue=queue).acquire()
    call = HeavyCall.objects.create(
        id=gate.token, owner=user, endpoint='$match', lane=queue, semantic=True, rows=2, payload={'rows': []},
        fingerprint='f', admission=submission.admission(gate), expires_at=timezone.now() + timedelta(minutes=10),
        **changes)
    return call


def scores(client, call):
    return [client.zscore(key, call.pk) for key in call.admission['keys']]


def now_ms(client):
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_a_call_renews_its_queued_leases_runs_and_releases_them(make_user, lanes, lines):
    call = admitted(make_user())
    assert min(scores(lanes, call)) > now_ms(lanes) + 500_000  # queued: until the queue deadline
    seen = {}

    def perform(row):
        seen['scores'] = scores(lanes, row)
        seen['state'] = HeavyCall.objects.get(pk=row.pk).state
        return {'ok': True}
    assert execution.run(call.pk, perform=perform, worker='w@h') == {'ok': True}
    assert seen['state'] == 'running'
    assert max(seen['scores']) < now_ms(lanes) + 61_000  # renewed by lease_seconds at start
    assert scores(lanes, call) == [None] * len(call.admission['keys'])  # released
    assert execution.succeed(call.pk)
    call.refresh_from_db()
    assert call.state == 'succeeded' and call.attempts == 1 and call.worker.startswith('w@h pid ')
    line = lines.call_args.args[0]
    assert (line['state'], line['queue'], line['task_id'], line['attempts']) == ('succeeded', 'es2_knn', call.pk, 1)
    assert line['run_ms'] >= 0 and line['wait_ms'] >= 0 and line['lease_lost'] is None


def test_a_failing_call_is_failed_refunded_and_releases_its_leases(make_user, lanes, lines):
    call = admitted(make_user())
    with pytest.raises(ValueError):
        execution.run(call.pk, perform=mock.Mock(side_effect=ValueError('no such source')))
    call.refresh_from_db()
    assert call.state == 'failed' and call.error == 'ValueError: no such source'
    assert call.refunded_at is not None
    assert scores(lanes, call) == [None] * len(call.admission['keys'])
    assert lines.call_args.args[0]['state'] == 'failed'


def test_a_cancelled_call_never_runs(make_user, lanes):
    call = admitted(make_user(), state='cancelled')
    perform = mock.Mock()
    assert execution.run(call.pk, perform=perform) is None
    perform.assert_not_called()


def test_a_call_past_its_queue_deadline_expires_unrun_and_frees_its_leases(make_user, lanes, lines):
    call = admitted(make_user())
    HeavyCall.objects.filter(pk=call.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    perform = mock.Mock()
    assert execution.run(call.pk, perform=perform) is None
    perform.assert_not_called()
    call.refresh_from_db()
    assert call.state == 'expired' and call.started_at is None
    assert scores(lanes, call) == [None] * len(call.admission['keys'])
    assert lines.call_args.args[0]['state'] == 'expired'


def test_a_redelivered_call_whose_leases_expired_takes_them_again(make_user, lanes):
    call = admitted(make_user(), state='running', attempts=1)
    for key in call.admission['keys']:
        lanes.zadd(key, {call.pk: 1000})  # its worker died long ago
    seen = {}
    execution.run(call.pk, perform=lambda row: seen.setdefault('scores', scores(lanes, row)))
    assert min(seen['scores']) > now_ms(lanes)  # counted again while it runs
    call.refresh_from_db()
    assert call.attempts == 2 and not call.lease_lost


def test_a_first_delivery_whose_leases_are_gone_runs_uncounted_and_says_so(make_user, lanes, lines):
    call = admitted(make_user())
    for key in call.admission['keys']:
        lanes.zrem(key, call.pk)
    perform = mock.Mock(return_value={})
    execution.run(call.pk, perform=perform)
    perform.assert_called_once()
    assert all(score is None for score in scores(lanes, call))  # never revived
    call.refresh_from_db()
    assert call.lease_lost
    execution.succeed(call.pk)
    assert lines.call_args.args[0]['lease_lost'] is True


def test_a_renewer_that_fails_to_start_still_runs_and_releases(make_user, lanes):
    call = admitted(make_user())
    with mock.patch('capacity.lease.LeaseRenewer.start', side_effect=RuntimeError("can't start new thread")):
        assert execution.run(call.pk, perform=lambda row: 'done') == 'done'
    assert scores(lanes, call) == [None] * len(call.admission['keys'])
    call.refresh_from_db()
    assert call.limiter_error == "RuntimeError: can't start new thread"


def test_a_failing_log_line_never_fails_the_call(make_user, lanes):
    call = admitted(make_user())
    execution.run(call.pk, perform=lambda row: {})
    with mock.patch('workers.execution.emit', side_effect=OSError('stdout is gone')) as emit:
        assert execution.succeed(call.pk)
    emit.assert_called_once()
    assert HeavyCall.objects.get(pk=call.pk).state == 'succeeded'


def test_a_message_whose_row_never_commits_is_dropped(make_user, lanes, monkeypatch):
    monkeypatch.setattr(execution, 'ROW_WAIT_SECONDS', 0.1)
    perform = mock.Mock()
    assert execution.run('0' * 32, perform=perform) is None
    perform.assert_not_called()


def test_a_redelivered_call_whose_result_was_stored_is_not_run_twice(make_user, lanes):
    call = admitted(make_user(), state='running', attempts=1)
    TaskResult.objects.create(task_id=call.pk, status='SUCCESS', result=json.dumps({'results': [1]}))
    perform = mock.Mock()
    assert execution.run(call.pk, perform=perform) == {'results': [1]}
    perform.assert_not_called()
    assert scores(lanes, call) == [None] * len(call.admission['keys'])
