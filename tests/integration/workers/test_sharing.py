"""Identical calls sharing one run of their work (workers.sharing: the work's claim and warm pointer in Redis;
workers.lifecycle: the calls on one Work): joining an open work, seeing its state and its end, letting go of
it on cancel, warm results, and what the sweep and retention do with shared work. On both lane stores; no
broker (`send` is never reached here)."""
import json
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from capacity.constants import Decision
from capacity.keys import warm_key, work_claim_key
from tests.integration.workers.test_lifecycle import another, held, queued, seen
from workers import lifecycle, sharing
from workers.models import Call, Work

pytestmark = pytest.mark.django_db
KEY = 'a' * 64


@pytest.fixture(autouse=True)
def quiet():
    with mock.patch('workers.lifecycle.reads.emit') as emit, mock.patch('workers.celery.app.control.revoke'):
        yield emit


def first_of(user, key=KEY, **fields):
    """The first call of a queued work `key` (admitted, with its leases, and the work's claim)."""
    call = queued(user, work_key=key, **fields)
    assert sharing.lead(key, call.work_id)
    return call


def run(call, result=None, failure=None):
    """Run `call`'s work to its end as a worker does: start, record, release and end in one round trip."""
    work = Work.objects.get(pk=call.work_id)
    assert lifecycle.start(work, 'w@me pid 1').kind == lifecycle.RUN
    lease = lifecycle.worker_lease(work, 60_000)
    if failure is not None:
        assert lifecycle.fail(work, failure, worker='w@me pid 1')
        text = None
    else:
        text = lifecycle.succeed(work, result or {'n': 1}, worker='w@me pid 1')
    lifecycle.end_with_release(work, lease, result_text=text)
    return work


def fresh(call):
    return Call.objects.select_related('work').get(pk=call.pk)


def test_a_joined_call_takes_no_lease_shows_its_works_state_and_gets_its_result(make_user, lanes, quiet):
    user = make_user()
    first = first_of(user)
    joined = another(user, first.work)
    assert (seen(joined).state, joined.served_as, joined.work_id) == ('queued', 'coalesced', first.work_id)
    assert lifecycle.admission_of(joined).keys == []  # no lane, no lease
    assert lifecycle.progress(fresh(joined)).position == lifecycle.progress(fresh(first)).position == 1
    work = Work.objects.get(pk=first.work_id)
    assert lifecycle.start(work, 'w@me pid 1').kind == lifecycle.RUN
    assert seen(joined).state == 'running'
    lifecycle.end_with_release(work, lifecycle.worker_lease(work, 60_000),
                               result_text=lifecycle.succeed(work, {'n': 7}, worker='w@me pid 1'))
    assert seen(joined).state == 'succeeded' and lifecycle.result(joined) == {'n': 7}
    assert answered(fresh(joined)) == answered(fresh(first)) == (200, {'n': 7})
    lines = {record['task_id']: record for record in (c.args[0] for c in quiet.call_args_list)}
    assert lines[joined.pk]['served_as'] == 'coalesced' and lines[joined.pk]['work_id'] == first.work_id
    assert lines[joined.pk]['decision'] == 'coalesced' and lines[joined.pk]['in_flight'] is None
    assert lines[first.pk]['served_as'] == 'run' and lines[first.pk]['work_id'] is None
    assert lanes.get(work_claim_key(KEY)) is None  # identical calls no longer join it ...
    assert lanes.get(warm_key(KEY)) == first.work_id.encode()  # ... its result answers them


def test_a_work_that_fails_fails_every_call_with_its_error(make_user, lanes):
    user = make_user()
    first = first_of(user)
    joined = [another(user, first.work) for _ in range(2)]
    failure = lifecycle.Failure.invalid({'target_repo_url': ['No such source.']})
    work = run(first, failure=failure)
    for call in map(fresh, joined):
        assert seen(call).state == 'failed' and answered(call) == (400, failure.body)
        assert answered(call) == answered(fresh(first))
    assert held(lanes, work) == 0 and lanes.get(warm_key(KEY)) is None  # a failure is never warm


def test_a_work_that_expires_expires_every_call(make_user, lanes):
    user = make_user()
    first = first_of(user, expires_at=timezone.now() + timedelta(seconds=30))
    joined = another(user, first.work)
    Work.objects.filter(pk=first.work_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert lifecycle.expire(fresh(joined).work).state == 'expired'  # a joined call's poll expires the work
    assert seen(first).state == seen(joined).state == 'expired' and held(lanes, first.work) == 0


def test_cancelling_a_joined_call_leaves_the_work_and_its_leases_alone(make_user, lanes):
    user = make_user()
    first = first_of(user)
    joined = another(user, first.work)
    assert lifecycle.cancel(joined) == 'queued'
    assert seen(joined).state == 'cancelled'
    assert seen(first).state == 'queued' and held(lanes, first.work) == 4
    assert lifecycle.cancel(joined) is None


def test_the_work_goes_on_for_the_calls_left_and_is_cancelled_with_the_last(make_user, lanes):
    user = make_user()
    first = first_of(user)
    one, two = (another(user, first.work) for _ in range(2))
    assert lifecycle.cancel(first) == 'queued'
    assert seen(first).state == 'cancelled' and Work.objects.get(pk=first.work_id).state == 'queued'
    assert answered(fresh(first))[0] == 409 and lifecycle.progress(fresh(first)).position is None
    assert lifecycle.cancel(first) is None  # its owner cancelled it already
    assert held(lanes, first.work) == 4
    assert lifecycle.cancel(one) == 'queued'
    assert Work.objects.get(pk=first.work_id).state == 'queued' and held(lanes, first.work) == 4  # one is left
    assert lifecycle.cancel(two) == 'queued'
    assert Work.objects.get(pk=first.work_id).state == 'cancelled' and held(lanes, first.work) == 0
    assert lanes.get(work_claim_key(KEY)) is None


def test_a_work_that_succeeds_after_its_first_call_let_go_shows_that_call_cancelled(make_user, lanes):
    user = make_user()
    first = first_of(user)
    joined = another(user, first.work)
    lifecycle.cancel(first)
    run(first, {'n': 3})
    assert answered(fresh(first))[0] == 409
    assert answered(fresh(joined)) == (200, {'n': 3})


def test_joining_a_work_that_ended_meanwhile_writes_nothing(make_user, lanes):
    user = make_user()
    first = first_of(user)
    stale = Work.objects.get(pk=first.work_id)
    lifecycle.cancel(first)  # before the joiner wrote its row
    assert another(user, stale) is None
    assert Call.objects.count() == 1


def test_find_answers_from_a_warm_result_only_within_the_ttl_in_force(make_user, lanes, configure):
    user = make_user()
    first = first_of(user)
    assert sharing.find(KEY).served_as == 'coalesced'
    run(first)
    found = sharing.find(KEY)
    assert (found.served_as, found.work.pk) == ('cached', first.work_id)
    cached = another(user, found.work, joined=False)
    assert (seen(cached).state, cached.served_as) == ('succeeded', 'cached') and lifecycle.result(cached) == {'n': 1}
    Work.objects.filter(pk=first.work_id).update(finished_at=timezone.now() - timedelta(seconds=301))
    assert sharing.find(KEY) is None  # past cache.ttl_seconds (300), though the pointer lives on
    Work.objects.filter(pk=first.work_id).update(finished_at=timezone.now())
    configure(cache={'ttl_seconds': 0})
    assert sharing.find(KEY) is None  # 0 turns warm results off


def test_a_claim_whose_work_succeeded_before_its_end_released_it_serves_its_result(make_user, lanes):
    """Between a work's success (committed) and its end (the claim turned into the warm pointer), an
    identical call is served its result, not run a second time."""
    work = first_of(make_user()).work
    assert lifecycle.start(work, 'w@me pid 1').kind == lifecycle.RUN
    assert lifecycle.succeed(work, {'n': 1}, worker='w@me pid 1')  # ended not yet: the claim is still held
    found = sharing.find(KEY)
    assert (found.served_as, found.work.pk) == ('cached', work.pk)


def test_a_claim_whose_work_ended_is_given_up(make_user, lanes):
    first = first_of(make_user())
    Work.objects.filter(pk=first.work_id).update(state='failed', finished_at=timezone.now())  # its end cut short
    assert sharing.find(KEY) is None
    assert lanes.get(work_claim_key(KEY)) is None
    assert sharing.lead(KEY, 'next')  # the next identical call leads


def test_a_claim_without_a_row_is_waited_for_then_given_up(make_user, lanes, monkeypatch):
    monkeypatch.setattr(sharing, 'WORK_ROW_WAIT_SECONDS', 0.1)
    assert sharing.lead(KEY, 'never-committed')
    assert sharing.find(KEY) is None and lanes.get(work_claim_key(KEY)) is None


def test_only_one_work_leads_a_key_and_abandon_gives_it_up(lanes):
    assert sharing.lead(KEY, 'one')
    assert not sharing.lead(KEY, 'two')
    sharing.abandon(KEY, 'two')  # not its claim: left alone
    assert lanes.get(work_claim_key(KEY)) == b'one'
    sharing.abandon(KEY, 'one')
    assert sharing.lead(KEY, 'two')


def test_without_redis_a_call_runs_its_own_work(make_user, lanes):
    from capacity.store import get_store
    first_of(make_user())
    get_store().mark_unavailable()
    assert sharing.find(KEY) is None  # nothing to share with, as far as this call can tell
    assert sharing.lead(KEY, 'mine')  # and it runs its own


def test_the_work_key_holds_the_caller_unless_sharing_across_users_is_on(make_user, settings):
    one, two = make_user(), make_user()
    key = lambda user: sharing.work_key('$rerank', {'q': 'fever', 'rows': []}, user.pk)  # noqa: E731
    assert key(one) != key(two) and key(one) == key(one)
    settings.HEAVY_LANES_SHARE_ACROSS_USERS = True
    assert key(one) == key(two)


def test_the_sweep_and_retention_see_one_work(make_user, lanes):
    user = make_user()
    first = first_of(user, created_at=timezone.now() - timedelta(minutes=5))
    another(user, first.work)
    assert [work.pk for work in lifecycle.maybe_lost(60, 60)] == [first.work_id]  # one message to look for
    run(first)
    old = timezone.now() - timedelta(days=30)
    Work.objects.filter(pk=first.work_id).update(finished_at=old)
    Call.objects.filter(work_id=first.work_id).update(created_at=old)
    cached = another(user, Work.objects.get(pk=first.work_id), joined=False)  # made today
    assert lifecycle.forget_finished(timezone.now() - timedelta(days=1)) == 0  # kept for the younger call
    assert lifecycle.result(fresh(cached)) == {'n': 1}
    Call.objects.filter(pk=cached.pk).update(created_at=old)
    assert lifecycle.forget_finished(timezone.now() - timedelta(days=1)) == 1
    assert not Call.objects.exists()


def test_decisions_of_calls_served_without_admission_are_said_in_their_admission(make_user, lanes):
    user = make_user()
    first = first_of(user)
    assert lifecycle.admission_of(another(user, first.work)).decision == Decision.COALESCED


def answered(call):
    """lifecycle.answer with a stored result's text parsed (the API sends it as it is stored)."""
    code, body = lifecycle.answer(call)
    return code, (json.loads(body.whole()) if isinstance(body, lifecycle.StoredJSON) else body)
