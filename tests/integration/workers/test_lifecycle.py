"""A work's state changes and its calls (workers.lifecycle), each a guarded UPDATE: what wins a race, what each
transition leaves behind (leases, result, usage, log lines), and what each call's owner sees. On both lane
stores; no broker: `send` is replaced where a message would be published."""
import json
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from capacity import gate
from capacity.constants import Decision, Lane
from workers import lifecycle
from workers.models import Call, ServedAs, State, Work

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quiet():
    with mock.patch('workers.lifecycle.reads.emit') as emit, mock.patch('workers.celery.app.control.revoke'):
        yield emit


def queued(user, call_fields=None, **fields):
    """A queued work of `user` with its first call, as the API records them (no message); the call, with
    its `work`."""
    admission = gate.admit(user, endpoint='$match', rows=2, semantic=True, queue='es2_knn', draws_on=Lane.ES2_KNN)
    values = {'id': admission.token, 'endpoint': '$match', 'queue': 'es2_knn', 'semantic': True, 'rows': 2,
                  'payload': {'rows': []},
                  'lease': {**admission.worker_lease_message(), 'limits': admission.worker_limits()},
                  'expires_at': timezone.now() + timedelta(minutes=10)}
    work = Work(**{**values, **fields})
    call = Call(id=admission.token, owner=user, endpoint='$match', rows=2, fingerprint='f',
                admission=admission.to_json(), **(call_fields or {}))
    return lifecycle.enqueue(work, call, publish=mock.Mock())


def another(user, work, joined=True):
    """A second call of `user` on `work`: joining it while open, or answered from its result."""
    admission = gate.unadmitted(user, Decision.COALESCED if joined else Decision.CACHED, endpoint='$match', rows=2,
                                semantic=True, queue='es2_knn')
    call = Call(id=admission.token, owner=user, endpoint='$match', rows=2, fingerprint='f',
                admission=admission.to_json())
    return lifecycle.join(call, work) if joined else lifecycle.serve_cached(call, work)


def held(client, work):
    return sum(1 for key in work.lease['keys'] if client.zscore(key, work.pk) is not None)


def seen(call):
    call = Call.objects.select_related('work').get(pk=call.pk)
    return lifecycle.seen(call, call.work)


def test_enqueue_writes_the_work_and_its_call_only_with_its_message(make_user, lanes):
    user = make_user()
    work = Work(id='a' * 32, endpoint='$match', queue='es2_knn', payload={},
                expires_at=timezone.now() + timedelta(minutes=10))
    call = Call(id='a' * 32, owner=user, endpoint='$match', fingerprint='f')
    with pytest.raises(ConnectionError):
        lifecycle.enqueue(work, call, publish=mock.Mock(side_effect=ConnectionError('broker down')))
    assert not Work.objects.exists() and not Call.objects.exists()
    lifecycle.enqueue(work, call, publish=mock.Mock())
    assert (Work.objects.get().state, Call.objects.get().work_id) == ('queued', 'a' * 32)


def test_only_one_of_two_starts_claims_a_queued_work(make_user, lanes):
    work = queued(make_user()).work
    twin = Work.objects.get(pk=work.pk)
    assert lifecycle.start(work, 'w@a pid 1').kind == lifecycle.RUN
    assert lifecycle.start(twin, 'w@b pid 2').kind == lifecycle.BUSY  # it read the row before the first claim
    assert Work.objects.get(pk=work.pk).worker == 'w@a pid 1'


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
    work = queued(make_user(), **fields).work
    assert lifecycle.start(work, 'w@me pid 2').kind == kind


def test_succeed_stores_the_result_with_the_state_and_only_for_a_running_work(make_user, lanes):
    call = queued(make_user())
    work = call.work
    assert lifecycle.succeed(work, {'n': 1}) is None  # never started
    lifecycle.start(work, 'w@me pid 1')
    assert lifecycle.succeed(work, {'n': 1}, worker='w@other pid 9') is None  # not its run
    assert json.loads(lifecycle.succeed(work, {'n': 1}, worker='w@me pid 1')) == {'n': 1}
    assert seen(call).state == 'succeeded' and lifecycle.result(call) == {'n': 1}
    assert not lifecycle.fail(work, 'late')  # ended: nothing changes
    assert Work.objects.get(pk=work.pk).state == 'succeeded'


def test_the_result_is_stored_by_django_celery_results_and_read_back_through_it(make_user, lanes):
    from celery import states
    from django_celery_results.models import TaskResult

    from workers.celery import app
    result = [{'row': {'name': 'chest pain'}, 'results': [{'id': 'HP:1', 'search_meta': {'score': 1}}]}]
    work = queued(make_user()).work
    lifecycle.start(work, 'w@me pid 1')
    lifecycle.succeed(work, result, worker='w@me pid 1')
    app.backend.store_result('by-backend', result, states.SUCCESS)
    fields = ('status', 'result', 'content_type', 'content_encoding', 'meta', 'task_name', 'worker')
    ours, theirs = (TaskResult.objects.values(*fields).get(task_id=i) for i in (work.pk, 'by-backend'))
    assert ours == theirs
    assert app.backend.get_task_meta(work.pk)['result'] == result


def test_a_success_is_announced_with_its_result_only_when_no_other_call_shares_the_work(make_user, lanes):
    """A waiting owner answers from the notice alone; a shared work's calls may have been cancelled since,
    so its end is announced bare and each waiting request reads its own call."""
    user = make_user()
    alone, shared = queued(user).work, queued(user).work
    another(user, shared)
    shared.refresh_from_db()
    published = []
    with mock.patch('workers.notify.publish', side_effect=lambda *args: published.append(args)):
        for work in (alone, shared):
            lifecycle.start(work, 'w@me pid 1')
            text = lifecycle.succeed(work, [{'n': work.pk}], worker='w@me pid 1')
            lifecycle.ended(work, result_text=text)
    assert [(work_id, state) for work_id, state, *_ in published] == [(alone.pk, State.SUCCEEDED),
                                                                     (shared.pk, State.SUCCEEDED)]
    assert json.loads(published[0][2]) == [{'n': alone.pk}] and published[1][2] is None
    assert published[0][3] == 0  # its count (num_returned): no candidates in these answers


def test_fail_records_the_error_and_the_usage_is_given_back_by_the_state(make_user, lanes):
    call = queued(make_user())
    lifecycle.start(call.work, 'w@me pid 1')
    assert lifecycle.fail(call.work, 'ValueError: no such source', worker='w@me pid 1')
    now = seen(call)
    assert (now.state, now.error) == ('failed', 'ValueError: no such source')
    assert lifecycle.result(call) is None


def test_a_queued_cancel_releases_the_leases_at_once_and_a_second_cancel_changes_nothing(make_user, lanes):
    call = queued(make_user())
    assert held(lanes, call.work) == 4
    assert lifecycle.cancel(call) == 'queued'
    assert held(lanes, call.work) == 0 and seen(call).state == 'cancelled'
    assert lifecycle.cancel(call) is None
    assert lifecycle.start(Work.objects.get(pk=call.work_id), 'w@me pid 1').kind == lifecycle.ENDED


def test_a_running_cancel_keeps_the_leases_until_the_work_stopped(make_user, lanes):
    call = queued(make_user())
    lifecycle.start(call.work, 'w@me pid 1')
    assert lifecycle.cancel(call) == 'running'
    assert held(lanes, call.work) == 4  # still running somewhere
    assert not lifecycle.beat(call.work, 'w@me pid 1')  # its worker learns it at the next heartbeat
    assert lifecycle.stopped(call.work_id)
    assert held(lanes, call.work) == 0
    assert not lifecycle.stopped(call.work_id)  # once


def test_a_cancel_that_finds_the_work_running_shows_its_start_though_another_clock_wrote_it_later(make_user, lanes):
    # The start is written with the database's clock (or a worker host's); this host's runs behind it.
    call = queued(make_user())
    lifecycle.start(call.work, 'w@me pid 1')
    ahead = timezone.now() + timedelta(seconds=2)
    Work.objects.filter(pk=call.work_id).update(started_at=ahead)
    assert lifecycle.cancel(call) == 'running'
    shown = seen(call)
    assert (shown.state, shown.started_at) == ('cancelled', ahead)
    assert Call.objects.get(pk=call.pk).cancelled_at == ahead


def test_cancelling_one_of_two_calls_leaves_the_work_and_the_last_cancels_it(make_user, lanes, quiet):
    user = make_user()
    first = queued(user)
    second = another(user, first.work)
    assert Work.objects.get(pk=first.work_id).holders == 2

    assert lifecycle.cancel(first) == 'queued'
    assert seen(first).state == 'cancelled' and seen(second).state == 'queued'
    work = Work.objects.get(pk=first.work_id)
    assert (work.state, work.holders) == ('queued', 1) and held(lanes, work) == 4  # it goes on for the other
    assert quiet.call_args.args[0]['task_id'] == first.pk and quiet.call_args.args[0]['state'] == 'cancelled'

    assert lifecycle.cancel(second) == 'queued'
    assert Work.objects.get(pk=first.work_id).state == 'cancelled' and held(lanes, work) == 0


def test_a_call_joins_only_an_open_work_and_a_warm_result_answers_at_once(make_user, lanes):
    user = make_user()
    call = queued(user)
    lifecycle.start(call.work, 'w@me pid 1')
    joined = another(user, call.work)
    assert (joined.served_as, seen(joined).state) == (ServedAs.COALESCED, 'running')
    lifecycle.succeed(call.work, {'n': 1}, worker='w@me pid 1')
    assert another(user, Work.objects.get(pk=call.work_id)) is None  # ended: nothing written
    cached = another(user, Work.objects.get(pk=call.work_id), joined=False)
    assert seen(cached).state == 'succeeded' and lifecycle.result(cached) == {'n': 1}
    assert Call.objects.filter(work_id=call.work_id).count() == 3


def test_a_works_end_logs_and_counts_each_call_still_open_once(make_user, lanes, quiet):
    user = make_user()
    call = queued(user)
    gone, kept = another(user, call.work), another(user, call.work)
    lifecycle.cancel(gone)
    lifecycle.start(call.work, 'w@me pid 1')
    work = Work.objects.get(pk=call.work_id)
    lifecycle.fail(work, 'boom', worker='w@me pid 1')
    quiet.reset_mock()
    lifecycle.ended(work)
    assert sorted(c.args[0]['task_id'] for c in quiet.call_args_list) == sorted([call.pk, kept.pk])
    assert {c.args[0]['state'] for c in quiet.call_args_list} == {'failed'}


def test_expire_only_a_queued_work_past_its_deadline(make_user, lanes, quiet):
    fresh = queued(make_user()).work
    assert lifecycle.expire(fresh).state == 'queued'
    late_call = queued(make_user(), expires_at=timezone.now() - timedelta(seconds=1))
    late = late_call.work
    assert lifecycle.expire(late).state == 'expired' and held(lanes, late) == 0
    assert seen(late_call).error == lifecycle.EXPIRED
    assert not lifecycle.end_unstarted(late.pk, 'expired')  # idempotent
    assert quiet.call_args.args[0]['state'] == 'expired'


def test_position_is_the_place_among_the_queues_queued_work_by_priority_then_age(make_user, lanes):
    now = timezone.now()
    old = queued(make_user(), priority=9, created_at=now - timedelta(seconds=30)).work
    new = queued(make_user(), priority=9, created_at=now).work
    staff = queued(make_user(), priority=0, created_at=now).work
    other_queue = queued(make_user(), queue='api_heavy', priority=0, created_at=now - timedelta(minutes=1)).work
    assert [lifecycle.position(work) for work in (staff, old, new)] == [1, 2, 3]
    assert lifecycle.position(other_queue) == 1


def test_a_call_that_joins_while_the_work_runs_is_ended_with_it_by_the_worker_that_loaded_it_before(
        make_user, lanes, quiet):
    """The worker read its work when it claimed it; a call that joined afterwards is counted, logged and
    answered by the work's end all the same (its end reads the work's calls again), and the end's notice is
    bare: the joined call's owner may have cancelled it meanwhile."""
    user = make_user()
    first = queued(user)
    loaded = Work.objects.get(pk=first.work_id)  # as the worker has it from its claim
    assert lifecycle.start(loaded, 'w@me pid 1').kind == lifecycle.RUN
    late = another(user, Work.objects.get(pk=first.work_id))
    published = []
    with mock.patch('workers.notify.publish', side_effect=lambda *args: published.append(args)):
        text = lifecycle.succeed(loaded, {'n': 1}, worker='w@me pid 1')
        lifecycle.ended(loaded, result_text=text)
    assert sorted(c.args[0]['task_id'] for c in quiet.call_args_list) == sorted([first.pk, late.pk])
    assert published == [(first.work_id, State.SUCCEEDED, None, None)]
    assert seen(late).state == 'succeeded' and lifecycle.result(late) == {'n': 1}


def test_a_process_uses_a_queues_measured_run_time_for_a_second_then_reads_it_again(lanes):
    import time

    from capacity.keys import holds_key, run_field
    from workers.lifecycle.reads import RUN_TIME_KEPT_SECONDS, run_seconds
    read_at = time.monotonic()  # before the read: what it keeps expires a second after the read itself
    assert run_seconds('es2_knn') is None  # nothing measured yet
    lanes.hset(holds_key(), run_field('es2_knn'), 4000)
    assert run_seconds('es2_knn') is None  # what it read is kept a moment
    deadline = time.monotonic() + RUN_TIME_KEPT_SECONDS + 5
    while run_seconds('es2_knn') is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert run_seconds('es2_knn') == 4.0 and time.monotonic() - read_at >= RUN_TIME_KEPT_SECONDS
    lanes.hset(holds_key(), run_field('es2_knn'), 6000)
    assert run_seconds('es2_knn') == 4.0


def test_a_waiting_requests_look_reads_its_cancel_and_its_works_end_in_one_query(make_user, lanes,
                                                                                django_assert_num_queries):
    from workers.lifecycle.reads import look_again
    call = queued(make_user())
    lifecycle.start(call.work, 'w@me pid 1')
    lifecycle.succeed(Work.objects.get(pk=call.work_id), {'n': 1}, worker='w@me pid 1')
    Call.objects.filter(pk=call.pk).update(cancelled_at=timezone.now())
    assert call.cancelled_at is None and call.work.state == State.RUNNING  # as this process last saw them
    with django_assert_num_queries(1):
        look_again(call)
    assert call.cancelled_at is not None
    assert (call.work.state, call.work.rows_done, call.work.finished_at is not None) == (State.SUCCEEDED, 0, True)
    Work.objects.filter(pk=call.work_id).delete()
    with pytest.raises(Work.DoesNotExist):
        look_again(call)


def test_the_shared_look_finds_the_works_that_ended_or_have_a_cancelled_call_in_one_query(
        make_user, lanes, django_assert_num_queries):
    from workers.lifecycle.reads import ended_among
    user = make_user()
    waiting, running, succeeded, cancelled_one, shared = (queued(user) for _ in range(5))
    lifecycle.start(running.work, 'w@me pid 1')
    lifecycle.start(succeeded.work, 'w@me pid 1')
    lifecycle.succeed(Work.objects.get(pk=succeeded.work_id), {'n': 1}, worker='w@me pid 1')
    lifecycle.cancel(cancelled_one)
    other = another(user, shared.work)
    lifecycle.cancel(shared)  # one of its two calls: the work goes on for the other, whose waiter must look
    assert Work.objects.get(pk=shared.work_id).state == State.QUEUED
    ids = [call.work_id for call in (waiting, running, succeeded, cancelled_one, shared)] + ['gone']
    with django_assert_num_queries(1):
        found = ended_among(ids)
    assert found == {succeeded.work_id, cancelled_one.work_id, shared.work_id}
    assert other.work_id == shared.work_id and ended_among([]) == set()
