"""Identical calls sharing one run of their work (workers.sharing, workers.lifecycle.sharing): joining an
open leader, following its state and its end, detaching on cancel, warm results, and what the sweep and
retention do with shared work. On both lane stores; no broker (`send` is never reached here)."""
import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from capacity import gate
from capacity.constants import Decision, Lane
from capacity.keys import warm_key, work_claim_key
from tests.integration.workers.test_lifecycle import held
from workers import lifecycle, sharing
from workers.models import HeavyCall
from workers.sweep import SweepReport, run_steps

pytestmark = pytest.mark.django_db
KEY = 'a' * 64


@pytest.fixture(autouse=True)
def quiet():
    with mock.patch('workers.lifecycle.reads.emit') as emit, mock.patch('workers.celery.app.control.revoke'):
        yield emit


def leader(user, key=KEY, **fields):
    """A queued call that leads the work `key` (admitted, with its leases, and the work's claim)."""
    admission = gate.admit(user, endpoint='$match', rows=2, semantic=True, queue='es2_knn', draws_on=Lane.ES2_KNN)
    values = dict(id=admission.token, owner=user, endpoint='$match', queue='es2_knn', semantic=True, rows=2,
                  payload={'rows': []}, fingerprint='f', work_key=key, admission=admission.to_json(),
                  expires_at=timezone.now() + timedelta(minutes=10))
    values.update(fields)
    call = HeavyCall.objects.create(**values)
    assert sharing.lead(key, call.pk)
    return call


def handle(user, decision=Decision.COALESCED):
    """A new, unsaved row of an identical call served without admission."""
    call_id = uuid.uuid4().hex
    admission = gate.unadmitted(user, decision, endpoint='$match', rows=2, semantic=True, queue='es2_knn',
                                token=call_id)
    return HeavyCall(id=call_id, owner=user, endpoint='$match', queue='es2_knn', semantic=True, rows=2,
                     payload={'rows': []}, fingerprint='f', admission=admission.to_json(),
                     expires_at=timezone.now() + timedelta(minutes=10))


def run(call, result=None):
    assert lifecycle.start(call, 'w@me pid 1').kind == lifecycle.RUN
    assert lifecycle.succeed(call, result or {'n': 1}, worker='w@me pid 1')
    lifecycle.admission_of(call).lease().release()
    lifecycle.ended(call)


def fresh(call):
    return HeavyCall.objects.get(pk=call.pk)


def test_a_follower_takes_no_lease_follows_its_leader_and_gets_its_result(make_user, lanes, quiet):
    lead = leader(make_user())
    follower = lifecycle.join(handle(make_user()), lead)
    assert (follower.state, follower.served_as, follower.leader_id) == ('queued', 'coalesced', lead.pk)
    assert lifecycle.admission_of(follower).keys == []  # no lane, no lease
    assert lifecycle.position(follower) == lifecycle.position(lead) == 1  # it takes no place of its own
    assert lifecycle.start(lead, 'w@me pid 1').kind == lifecycle.RUN
    assert fresh(follower).state == 'running'
    assert lifecycle.succeed(lead, {'n': 7}, worker='w@me pid 1')
    lifecycle.admission_of(lead).lease().release()
    lifecycle.ended(lead)
    follower = fresh(follower)
    assert follower.state == 'succeeded' and lifecycle.result(follower) == {'n': 7}
    assert lifecycle.answer(follower) == lifecycle.answer(fresh(lead)) == (200, {'n': 7})
    lines = {record['task_id']: record for record in (c.args[0] for c in quiet.call_args_list)}
    assert lines[follower.pk]['served_as'] == 'coalesced' and lines[follower.pk]['work_id'] == lead.pk
    assert lines[follower.pk]['decision'] == 'coalesced' and lines[follower.pk]['in_flight'] is None
    assert lines[lead.pk]['served_as'] == 'run'
    assert lanes.get(work_claim_key(KEY)) is None  # identical calls no longer join it ...
    assert lanes.get(warm_key(KEY)) == lead.pk.encode()  # ... its result answers them


def test_a_leader_that_fails_fails_its_followers_with_its_error(make_user, lanes):
    lead = leader(make_user())
    followers = [lifecycle.join(handle(make_user()), lead) for _ in range(2)]
    lifecycle.start(lead, 'w@me pid 1')
    failure = lifecycle.Failure.invalid({'target_repo_url': ['No such source.']})
    assert lifecycle.fail(lead, failure, worker='w@me pid 1')
    lifecycle.admission_of(lead).lease().release()
    lifecycle.ended(lead)
    for follower in map(fresh, followers):
        assert (follower.state, follower.error_status, follower.error_body) == ('failed', 400, failure.body)
        assert follower.refunded_at is not None  # its usage given back, like its leader's
        assert lifecycle.answer(follower) == lifecycle.answer(fresh(lead))
    assert held(lanes, lead) == 0 and lanes.get(warm_key(KEY)) is None  # a failure is never warm


def test_a_leader_that_expires_expires_its_followers(make_user, lanes):
    lead = leader(make_user(), expires_at=timezone.now() + timedelta(seconds=30))
    follower = lifecycle.join(handle(make_user()), lead)
    HeavyCall.objects.filter(pk__in=[lead.pk, follower.pk]).update(expires_at=timezone.now() - timedelta(seconds=1))
    follower.refresh_from_db()
    assert lifecycle.expire(follower).state == 'expired'  # a follower's poll expires the work
    assert fresh(lead).state == 'expired' and held(lanes, lead) == 0


def test_cancelling_a_follower_leaves_the_work_and_its_leases_alone(make_user, lanes):
    lead = leader(make_user())
    follower = lifecycle.join(handle(make_user()), lead)
    assert lifecycle.cancel(follower) == 'queued'
    assert fresh(follower).state == 'cancelled'
    assert fresh(lead).state == 'queued' and held(lanes, lead) == 4
    assert lifecycle.cancel(follower) is None


def test_a_cancelled_leader_detaches_and_the_work_is_cancelled_with_its_last_handle(make_user, lanes):
    lead = leader(make_user())
    one, two = (lifecycle.join(handle(make_user()), lead) for _ in range(2))
    assert lifecycle.cancel(lead) == 'queued'
    lead = fresh(lead)
    assert lead.state == 'queued' and lead.seen_state == 'cancelled' and lead.finished  # the work goes on
    assert lifecycle.answer(lead)[0] == 409 and lifecycle.position(lead) is None
    assert lifecycle.cancel(lead) is None  # its owner cancelled it already
    assert held(lanes, lead) == 4
    assert lifecycle.cancel(one) == 'queued'
    assert fresh(lead).state == 'queued' and held(lanes, lead) == 4  # one handle is left
    assert lifecycle.cancel(two) == 'queued'
    assert fresh(lead).state == 'cancelled' and held(lanes, lead) == 0  # the last one: the work too
    assert lanes.get(work_claim_key(KEY)) is None


def test_a_detached_leader_that_succeeds_shows_its_owner_cancelled_and_the_others_the_result(make_user, lanes):
    lead = leader(make_user())
    follower = lifecycle.join(handle(make_user()), lead)
    lifecycle.cancel(lead)
    run(fresh(lead), {'n': 3})
    assert lifecycle.answer(fresh(lead))[0] == 409
    assert lifecycle.answer(fresh(follower)) == (200, {'n': 3})


def test_joining_a_work_cancelled_meanwhile_leaves_nothing_behind(make_user, lanes):
    lead = leader(make_user())
    stale = fresh(lead)
    lifecycle.cancel(lead)  # before the joiner wrote its row
    row = handle(make_user())
    assert lifecycle.join(row, stale) is None
    assert not HeavyCall.objects.filter(pk=row.pk).exists()


def test_joining_a_work_that_ended_meanwhile_ends_the_handle_like_the_others(make_user, lanes):
    lead = leader(make_user())
    stale = fresh(lead)
    run(lead, {'n': 5})
    follower = lifecycle.join(handle(make_user()), stale)
    assert follower.state == 'succeeded' and lifecycle.result(follower) == {'n': 5}


def test_find_answers_from_a_warm_result_only_within_the_ttl_in_force(make_user, lanes, configure):
    lead = leader(make_user())
    assert sharing.find(KEY).served_as == 'coalesced'
    run(lead)
    found = sharing.find(KEY)
    assert (found.served_as, found.call.pk) == ('cached', lead.pk)
    cached = lifecycle.serve_cached(handle(make_user(), Decision.CACHED), found.call)
    assert (cached.state, cached.served_as) == ('succeeded', 'cached') and lifecycle.result(cached) == {'n': 1}
    HeavyCall.objects.filter(pk=lead.pk).update(finished_at=timezone.now() - timedelta(seconds=301))
    assert sharing.find(KEY) is None  # past cache.ttl_seconds (300), though the pointer lives on
    HeavyCall.objects.filter(pk=lead.pk).update(finished_at=timezone.now())
    configure(cache={'ttl_seconds': 0})
    assert sharing.find(KEY) is None  # 0 turns warm results off


def test_a_claim_whose_call_succeeded_before_its_end_released_it_serves_its_result(make_user, lanes):
    """Between a leader's success (committed) and its end (the claim turned into the warm pointer), an
    identical call is served its result, not run a second time."""
    lead = leader(make_user())
    assert lifecycle.start(lead, 'w@me pid 1').kind == lifecycle.RUN
    assert lifecycle.succeed(lead, {'n': 1}, worker='w@me pid 1')  # ended() not yet: the claim is still held
    found = sharing.find(KEY)
    assert (found.served_as, found.call.pk) == ('cached', lead.pk)


def test_a_claim_whose_call_ended_is_given_up(make_user, lanes):
    lead = leader(make_user())
    HeavyCall.objects.filter(pk=lead.pk).update(state='failed', finished_at=timezone.now())  # its end cut short
    assert sharing.find(KEY) is None
    assert lanes.get(work_claim_key(KEY)) is None
    assert sharing.lead(KEY, 'next')  # the next identical call leads


def test_a_claim_without_a_row_is_waited_for_then_given_up(make_user, lanes, monkeypatch):
    monkeypatch.setattr(sharing, 'LEADER_ROW_WAIT_SECONDS', 0.1)
    assert sharing.lead(KEY, 'never-committed')
    assert sharing.find(KEY) is None and lanes.get(work_claim_key(KEY)) is None


def test_only_one_call_leads_a_work_and_abandon_gives_it_up(lanes):
    assert sharing.lead(KEY, 'one')
    assert not sharing.lead(KEY, 'two')
    sharing.abandon(KEY, 'two')  # not its claim: left alone
    assert lanes.get(work_claim_key(KEY)) == b'one'
    sharing.abandon(KEY, 'one')
    assert sharing.lead(KEY, 'two')


def test_a_leader_nobody_joined_ends_without_looking_for_followers_and_one_joined_finds_them(
        make_user, lanes, redis_client):
    from capacity.keys import joined_key
    alone = leader(make_user())
    with mock.patch('workers.lifecycle.sharing.settle') as settle:
        run(alone)
    settle.assert_not_called()
    assert redis_client.get(work_claim_key(KEY)) is None  # the claim was given up all the same

    joined = leader(make_user(), key='b' * 64)
    follower = lifecycle.join(handle(make_user()), joined)
    assert redis_client.exists(joined_key(joined.pk))
    run(joined, {'n': 2})
    assert fresh(follower).state == 'succeeded' and lifecycle.result(fresh(follower)) == {'n': 2}
    assert not redis_client.exists(joined_key(joined.pk))  # the end took the mark away


@pytest.mark.parametrize('fault', ['the whole end', 'the work release alone'])
def test_a_leader_whose_redis_cant_say_looks_for_its_followers_in_the_database(make_user, lanes, fault):
    from capacity.store import LaneStore
    real = LaneStore.release_and_end

    def work_release_fails(store, keys, token, **rest):
        removed, published, _ = real(store, keys, token, **{**rest, 'work': None})
        return removed, published, ConnectionError('redis went away')
    lead = leader(make_user())
    follower = lifecycle.join(handle(make_user()), lead)
    failing = (dict(side_effect=ConnectionError('redis went away')) if fault == 'the whole end'
               else dict(new=work_release_fails))
    with mock.patch('capacity.store.LaneStore.release_and_end', **failing):
        run(lead)
    assert fresh(follower).state == 'succeeded'


def test_a_call_that_cant_mark_its_join_doesnt_join(make_user, lanes):
    lead = leader(make_user())
    with mock.patch('capacity.store.LaneStore.command', side_effect=ConnectionError('redis went away')):
        assert lifecycle.join(handle(make_user()), lead) is None
    assert not HeavyCall.objects.filter(leader_id=lead.pk).exists()  # nothing left behind: it runs its own


def test_the_sweep_settles_followers_whose_leaders_end_was_cut_short(make_user, lanes):
    lead = leader(make_user())
    follower = lifecycle.join(handle(make_user()), lead)
    lifecycle.start(lead, 'w@me pid 1')
    assert lifecycle.succeed(lead, {'n': 1}, worker='w@me pid 1')  # and the worker died before `ended`
    report = SweepReport()
    with mock.patch('workers.sweep.messages') as messages:
        messages.present.return_value = set()
        run_steps(report, 60, broker=None)
    assert report.settled == 1 and fresh(follower).state == 'succeeded'


def test_the_sweep_never_resends_a_follower(make_user, lanes):
    lead = leader(make_user(), created_at=timezone.now() - timedelta(minutes=5))
    follower = lifecycle.join(handle(make_user()), lead)
    HeavyCall.objects.filter(pk=follower.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert [call.pk for call in lifecycle.maybe_lost(60, 60)] == [lead.pk]


def test_retention_keeps_a_call_whose_result_younger_handles_show(make_user, lanes):
    lead = leader(make_user())
    run(lead)
    old = timezone.now() - timedelta(days=30)
    HeavyCall.objects.filter(pk=lead.pk).update(finished_at=old)
    cached = lifecycle.serve_cached(handle(make_user(), Decision.CACHED), fresh(lead))
    assert lifecycle.forget_finished(timezone.now() - timedelta(days=1)) == 0
    assert lifecycle.result(fresh(cached)) == {'n': 1}
    HeavyCall.objects.filter(pk=cached.pk).update(finished_at=old)
    assert lifecycle.forget_finished(timezone.now() - timedelta(days=1)) == 2
