"""A heavy call's state changes (workers.lifecycle), each a guarded UPDATE: what wins a race, what each
transition leaves behind (leases, result, usage, log line). On both lane stores; no broker: `send` is
replaced where a message would be published."""
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from capacity import gate
from capacity.constants import Lane
from workers import lifecycle
from workers.models import HeavyCall

pytestmark = pytest.mark.django_db




@pytest.fixture(autouse=True)
def quiet():
    with mock.patch('workers.lifecycle.reads.emit') as emit, mock.patch('workers.celery.app.control.revoke'):
        yield emit


def queued(user, **fields):
    admission = gate.admit(user, endpoint='$match', rows=2, semantic=True, queue='es2_knn', draws_on=Lane.ES2_KNN)
    values = dict(id=admission.token, owner=user, endpoint='$match', queue='es2_knn', semantic=True, rows=2,
                  payload={'rows': []}, fingerprint='f', admission=admission.to_json(),
                  expires_at=timezone.now() + timedelta(minutes=10))
    values.update(fields)
    return HeavyCall.objects.create(**values)


def held(client, call):
    return sum(1 for key in lifecycle.admission_of(call).keys if client.zscore(key, call.pk) is not None)


def test_enqueue_writes_the_row_only_with_its_message(make_user, lanes):
    user = make_user()
    call = HeavyCall(id='a' * 32, owner=user, endpoint='$match', queue='es2_knn', payload={}, fingerprint='f',
                     expires_at=timezone.now() + timedelta(minutes=10))
    with pytest.raises(ConnectionError):
        lifecycle.enqueue(call, publish=mock.Mock(side_effect=ConnectionError('broker down')))
    assert not HeavyCall.objects.filter(pk=call.pk).exists()
    lifecycle.enqueue(call, publish=mock.Mock())
    assert HeavyCall.objects.get(pk=call.pk).state == 'queued'


def test_only_one_of_two_starts_claims_a_queued_call(make_user, lanes):
    call = queued(make_user())
    twin = HeavyCall.objects.get(pk=call.pk)
    assert lifecycle.start(call, 'w@a pid 1').kind == lifecycle.RUN
    assert lifecycle.start(twin, 'w@b pid 2').kind == lifecycle.BUSY  # it read the row before the first claim
    assert HeavyCall.objects.get(pk=call.pk).worker == 'w@a pid 1'


@pytest.mark.parametrize('fields, kind', [
    ({'state': 'cancelled'}, lifecycle.ENDED),
    ({'state': 'succeeded'}, lifecycle.ENDED),
    ({'expires_at': timezone.now() - timedelta(seconds=1)}, lifecycle.EXPIRE),
    # running on a live worker elsewhere: a duplicate message
    ({'state': 'running', 'attempts': 1, 'worker': 'w@other pid 1', 'heartbeat_at': timezone.now()}, lifecycle.BUSY),
    # running, but its worker stopped beating long ago: taken over
    ({'state': 'running', 'attempts': 1, 'worker': 'w@other pid 1',
      'heartbeat_at': timezone.now() - timedelta(minutes=5)}, lifecycle.RUN),
])
def test_start(fields, kind, make_user, lanes):
    call = queued(make_user(), **fields)
    assert lifecycle.start(call, 'w@me pid 2').kind == kind


def test_succeed_stores_the_result_with_the_state_and_only_for_a_running_call(make_user, lanes):
    call = queued(make_user())
    assert not lifecycle.succeed(call, {'n': 1})  # never started
    lifecycle.start(call, 'w@me pid 1')
    assert not lifecycle.succeed(call, {'n': 1}, worker='w@other pid 9')  # not its run
    assert lifecycle.succeed(call, {'n': 1}, worker='w@me pid 1')
    call.refresh_from_db()
    assert call.state == 'succeeded' and lifecycle.result(call) == {'n': 1}
    assert not lifecycle.fail(call, 'late')  # ended: nothing changes
    assert HeavyCall.objects.get(pk=call.pk).state == 'succeeded'


def test_a_success_is_announced_with_its_result_unless_its_owner_let_go_of_it(make_user, lanes):
    """The end's notice carries the stored result for the owner's waiting request only when the success
    shut out a detach (workers.notify); a detached leader's is bare, its followers' carry it."""
    import json

    from workers.models import State
    owned, detached = queued(make_user()), queued(make_user())
    for call in (owned, detached):
        lifecycle.start(call, 'w@me pid 1')
    HeavyCall.objects.filter(pk=detached.pk).update(detached_at=timezone.now())
    published = []
    with mock.patch('workers.notify.publish', side_effect=lambda *args: published.append(args)):
        for call in (owned, detached):
            assert lifecycle.succeed(call, [{'n': call.pk}], worker='w@me pid 1')
            lifecycle.ended(call)
    assert [(call_id, state) for call_id, state, _ in published] == [(owned.pk, State.SUCCEEDED),
                                                                     (detached.pk, State.SUCCEEDED)]
    assert json.loads(published[0][2]) == [{'n': owned.pk}] and published[1][2] is None
    assert json.loads(detached.work_result_text) == [{'n': detached.pk}]
    assert HeavyCall.objects.get(pk=detached.pk).state == State.SUCCEEDED


def test_a_result_row_is_written_as_the_result_backend_writes_it_and_the_backend_reads_it(make_user, lanes):
    from celery import states
    from django_celery_results.models import TaskResult

    from workers.celery import app
    from workers.lifecycle import running
    result = [{'row': {'name': 'chest pain'}, 'results': [{'id': 'HP:1', 'search_meta': {'score': 1}}]}]
    app.backend.store_result('by-backend', result, states.SUCCESS)
    running.store_result('by-lifecycle', result)
    fields = ('status', 'result', 'content_type', 'content_encoding', 'meta', 'task_name', 'worker',
              'task_args', 'task_kwargs')
    ours, theirs = (TaskResult.objects.values(*fields).get(task_id=i) for i in ('by-lifecycle', 'by-backend'))
    assert ours == theirs
    assert app.backend.get_task_meta('by-lifecycle')['result'] == result
    running.store_result('by-lifecycle', {'n': 2})  # a second write replaces the first, as the backend's
    assert app.backend.get_task_meta('by-lifecycle')['result'] == {'n': 2}
    assert TaskResult.objects.filter(task_id='by-lifecycle').count() == 1


def test_fail_records_the_error_and_gives_the_usage_back(make_user, lanes):
    call = queued(make_user())
    lifecycle.start(call, 'w@me pid 1')
    assert lifecycle.fail(call, 'ValueError: no such source', worker='w@me pid 1')
    call.refresh_from_db()
    assert (call.state, call.error) == ('failed', 'ValueError: no such source')
    assert call.refunded_at is not None and lifecycle.result(call) is None
    assert lifecycle.error_of(call) == 'ValueError: no such source'


def test_a_queued_cancel_releases_the_leases_at_once_and_a_second_cancel_changes_nothing(make_user, lanes):
    call = queued(make_user())
    assert held(lanes, call) == 4
    assert lifecycle.cancel(call) == 'queued'
    assert held(lanes, call) == 0 and call.state == 'cancelled'
    assert lifecycle.cancel(call) is None
    assert lifecycle.start(call, 'w@me pid 1').kind == lifecycle.ENDED


def test_a_running_cancel_keeps_the_leases_until_the_work_stopped(make_user, lanes):
    call = queued(make_user())
    lifecycle.start(call, 'w@me pid 1')
    assert lifecycle.cancel(call) == 'running'
    assert held(lanes, call) == 4  # still running somewhere
    assert not lifecycle.beat(call, 'w@me pid 1')  # its worker learns it at the next heartbeat
    assert lifecycle.stopped(call.pk)
    assert held(lanes, call) == 0


def test_expire_only_a_queued_call_past_its_deadline(make_user, lanes, quiet):
    fresh = queued(make_user())
    assert lifecycle.expire(fresh).state == 'queued'
    late = queued(make_user(), expires_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.expire(late).state == 'expired' and held(lanes, late) == 0
    assert lifecycle.error_of(late) == lifecycle.EXPIRED
    assert not lifecycle.end_unstarted(late.pk, 'expired')  # idempotent
    assert quiet.call_args.args[0]['state'] == 'expired'


def test_position_is_the_place_among_the_queues_queued_calls_by_priority_then_age(make_user, lanes):
    now = timezone.now()
    old = queued(make_user(), priority=9, created_at=now - timedelta(seconds=30))
    new = queued(make_user(), priority=9, created_at=now)
    staff = queued(make_user(), priority=0, created_at=now)
    other_queue = queued(make_user(), queue='api_heavy', priority=0, created_at=now - timedelta(minutes=1))
    assert [lifecycle.position(call) for call in (staff, old, new)] == [1, 2, 3]
    assert lifecycle.position(other_queue) == 1
