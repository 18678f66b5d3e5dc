"""A call's leases after admission: renewal (all or nothing), the renewer thread, release, retake, and
their fail-open behaviour. On both lane stores."""
import threading
import time
from unittest import mock

import pytest
import redis

from capacity import failopen, releases
from capacity.releases import DeferredReleases
from capacity.constants import Lane
from capacity.keys import lane_key
from capacity.lease import Lease, LeaseRenewer
from capacity.operations import Ended, Operations
from capacity.store import get_store

pytestmark = pytest.mark.usefixtures('lanes')


def held_lease(client, lanes=(Lane.API_HEAVY, Lane.USER), token='tok', lease_ms=60_000):
    keys = [lane_key(lane) for lane in lanes]
    get_store().acquire(keys, [9] * len(keys), token, lease_ms, force=False)
    return Lease(keys, token, lease_ms)


def now_ms(client):
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_renewal_extends_every_lease_or_none(lanes):
    lease = held_lease(lanes, lease_ms=5_000)
    assert all(lanes.zscore(key, 'tok') < now_ms(lanes) + 6_000 for key in lease.keys)
    lease.lease_ms = 60_000
    assert lease.renew()
    assert all(lanes.zscore(key, 'tok') > now_ms(lanes) + 30_000 for key in lease.keys)

    expired, alive = lease.keys
    lanes.zadd(expired, {'tok': 1000})
    before = lanes.zscore(alive, 'tok')
    assert not lease.renew()
    assert lease.lease_lost
    assert lanes.zscore(expired, 'tok') == 1000  # never revived
    assert lanes.zscore(alive, 'tok') == before  # nor renewed alone


def test_a_deleted_lane_is_not_re_added(lanes):
    lease = held_lease(lanes)
    lanes.delete(lease.keys[0])
    assert not lease.renew()
    assert lanes.exists(lease.keys[0]) == 0


def test_a_redelivered_call_takes_its_leases_again(lanes):
    lease = held_lease(lanes)
    for key in lease.keys:
        lanes.zadd(key, {'tok': 1000})
    assert not lease.renew()
    assert lease.retake([1, 1])  # forced: it was admitted once, whatever the counts now
    assert not lease.lease_lost
    assert all(lanes.zscore(key, 'tok') > now_ms(lanes) for key in lease.keys)


def test_release_removes_only_this_calls_leases(lanes):
    lease = held_lease(lanes)
    other = held_lease(lanes, token='other')
    lease.release()
    lease.release()
    assert [lanes.zrange(key, 0, -1) for key in lease.keys] == [[b'other'], [b'other']]
    other.release()


def test_drop_releases_one_lane_and_keeps_the_rest(lanes):
    lease = held_lease(lanes, lanes=(Lane.API_HEAVY, Lane.USER))
    lease.drop([lease.keys[1]])
    assert lanes.zcard(lane_key(Lane.USER)) == 0 and lease.keys == [lane_key(Lane.API_HEAVY)]
    assert lease.renew()


def test_the_renewer_thread_renews_until_stopped(lanes):
    lease = held_lease(lanes)
    renewer = LeaseRenewer(lease, interval=0.02, max_hold=60)
    with mock.patch.object(lease, 'renew', wraps=lease.renew) as renew:
        renewer.start()
        time.sleep(0.2)
        renewer.stop()
        renewer.join(1)
    assert not renewer.is_alive() and renew.call_count >= 3


def test_the_renewer_stops_at_max_hold(lanes):
    lease = held_lease(lanes)
    renewer = LeaseRenewer(lease, interval=0.01, max_hold=0)
    with mock.patch.object(lease, 'renew') as renew:
        renewer.start()
        renewer.join(1)
    assert not renewer.is_alive() and renew.call_count == 0


def test_the_renewer_stops_once_a_lease_is_lost(lanes):
    lease = held_lease(lanes)
    lanes.zadd(lease.keys[0], {'tok': 1000})
    renewer = LeaseRenewer(lease, interval=0.01, max_hold=60)
    with mock.patch.object(lease, 'renew', wraps=lease.renew) as renew:
        renewer.start()
        renewer.join(1)
    assert not renewer.is_alive() and renew.call_count == 1 and lease.lease_lost


def test_a_failed_release_or_renewal_is_recorded_not_raised(lanes):
    lease = held_lease(lanes)
    with mock.patch.object(Operations, 'renew', side_effect=redis.TimeoutError('slow')):
        assert not lease.renew()
    assert lease.error == 'TimeoutError: slow' and not get_store().is_available()
    get_store().unavailable_until = 0
    with mock.patch.object(Operations, 'release', side_effect=redis.ConnectionError('gone')):
        lease.release()
    assert lease.error == 'ConnectionError: gone' and not get_store().is_available()


def test_renewal_and_release_skip_redis_after_it_failed_and_the_release_is_sent_once_redis_answers(lanes):
    lease = held_lease(lanes)
    store = get_store()
    store.mark_unavailable()
    callers = []
    real_release = store.ops.release

    def release(keys, token, *measures):
        callers.append(threading.current_thread().name)
        return real_release(keys, token, *measures)
    with mock.patch.object(Operations, 'renew') as renew, mock.patch.object(store.ops, 'release', side_effect=release):
        assert not lease.renew()
        lease.release()
        assert lease.error == failopen.RELEASE_DEFERRED
        # The call itself doesn't touch Redis inside the window; the release thread sends it at once.
        wait_for(lambda: not any(lanes.zscore(key, 'tok') for key in lease.keys), 3)
    renew.assert_not_called()
    assert callers == ['ocl-capacity-release']
    assert store.releases.pending() == {}


def test_a_release_that_failed_is_sent_again_once_redis_answers(lanes, settings):
    settings.CAPACITY_REDIS_RETRY_SECONDS = 0.3
    lease = held_lease(lanes)
    real_release = get_store().ops.release
    calls = []

    def flaky(keys, token, *measures):
        calls.append(token)
        if len(calls) == 1:
            raise redis.ConnectionError('gone')
        return real_release(keys, token, *measures)
    with mock.patch.object(Operations, 'release', side_effect=flaky):
        lease.release()
        assert lease.error == 'ConnectionError: gone' and not get_store().is_available()
        wait_for(lambda: not any(lanes.zscore(key, 'tok') for key in lease.keys), 3)
    assert calls == ['tok', 'tok']


def test_a_release_with_the_end_gives_the_leases_back_once_and_sends_the_rest_with_them(lanes):
    lease = held_lease(lanes)
    assert lease.release_and_end(ran=('es2_knn', 10), notice=('notice-lease-test', 'succeeded'))
    assert not any(lanes.zscore(key, 'tok') for key in lease.keys)
    get_store().acquire(lease.keys, [9, 9], 'tok', 60_000, force=False)  # as if taken again since
    assert lease.release_and_end(notice=('notice-lease-test', 'succeeded'))
    assert all(lanes.zscore(key, 'tok') for key in lease.keys)  # a lease goes back once


def test_a_release_with_the_end_that_fails_is_sent_again_and_says_nothing_was_announced(lanes, settings):
    settings.CAPACITY_REDIS_RETRY_SECONDS = 0.3
    lease = held_lease(lanes)
    with mock.patch.object(Operations, 'release_and_end', side_effect=redis.ConnectionError('gone')):
        assert not lease.release_and_end(notice=('notice-lease-test', 'succeeded'))
    assert lease.error == 'ConnectionError: gone' and not get_store().is_available()
    wait_for(lambda: not any(lanes.zscore(key, 'tok') for key in lease.keys), 3)  # the deferred release
    skipped = held_lease(lanes, token='tok-2')
    get_store().mark_unavailable()
    assert not skipped.release_and_end(notice=('notice-lease-test', 'x'))
    assert skipped.error == failopen.RELEASE_DEFERRED
    wait_for(lambda: not any(lanes.zscore(key, 'tok-2') for key in skipped.keys), 3)


def test_a_release_with_the_end_whose_release_alone_fails_still_announces(lanes, settings):
    settings.CAPACITY_REDIS_RETRY_SECONDS = 0.3
    lease = held_lease(lanes)
    real = Operations.release_and_end

    def release_refused(ops, keys, token, *rest):
        ended = real(ops, [], token, *rest)
        return Ended(redis.ResponseError('release refused'), ended.published, ended.unclaimed)
    with mock.patch.object(Operations, 'release_and_end', release_refused):
        assert lease.release_and_end(notice=('notice-lease-test', 'succeeded'))
    assert lease.error == 'ResponseError: release refused'
    wait_for(lambda: not any(lanes.zscore(key, 'tok') for key in lease.keys), 3)  # sent again


def test_deferred_releases_are_bounded_and_merge_the_keys_of_one_token(monkeypatch):
    deferred = DeferredReleases(store=None)
    monkeypatch.setattr(deferred, '_ensure_thread', lambda: None)  # nothing is sent while the test looks
    monkeypatch.setattr(releases, 'MAX_DEFERRED', 2)
    deferred.defer(['a'], 't1')
    deferred.defer(['b'], 't1')
    deferred.defer(['a'], 't2')
    deferred.defer(['a'], 't3')
    assert deferred.pending() == {'t2': ['a'], 't3': ['a']}


def test_an_acquire_whose_answer_never_came_is_released_once_redis_answers(lanes, make_user, db):
    from capacity import gate
    real_acquire = get_store().ops.acquire

    def lost(keys, limits, token, lease_ms, force, not_after_ms=None):
        real_acquire(keys, limits, token, lease_ms, force)  # Redis ran it...
        raise redis.TimeoutError('Timeout reading from socket')  # ...but the answer never came
    with mock.patch.object(get_store().ops, 'acquire', side_effect=lost):
        admission = gate.admit(make_user(), endpoint='$match', rows=2, semantic=True)
    assert admission.decision == 'unavailable' and not admission.holding
    wait_for(lambda: not any(lanes.zcard(key) for key in admission.keys), 3)


def wait_for(condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.02)


def test_one_redis_error_cant_cost_a_call_two_renewals(settings):
    from capacity.defaults import DEFAULTS
    assert settings.CAPACITY_REDIS_RETRY_SECONDS < DEFAULTS['lease_seconds'] - 2 * DEFAULTS['renew_seconds']


def test_a_renewal_after_release_changes_nothing(lanes):
    lease = held_lease(lanes)
    lease.release()
    assert not lease.renew()
    assert all(lanes.zcard(key) == 0 for key in lease.keys)


def test_renewals_from_many_threads_keep_one_lease_each(lanes):
    lease = held_lease(lanes)
    threads = [threading.Thread(target=lease.renew) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(lanes.zcard(key) == 1 for key in lease.keys)
