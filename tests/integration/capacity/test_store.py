"""The lane store's contract, run on fakeredis (real Lua through lupa) and on the real Redis.

Every test goes through the store's operations (capacity.operations: its runner, its scripts; the raising
layer under the fail-open verbs) with the `store` fixture, and reads Redis directly with the same client to
check what the scripts left behind.
"""
import fakeredis
import pytest
import redis

from capacity.constants import Lane
from capacity.keys import (
    expired_key, hold_field, holds_key, lane_id, lane_key, run_field, warm_key, work_claim_key,
)
from capacity.operations import LATE_ACQUIRE, Acquired, Ended
from capacity.store import LaneStore, get_store, use_store

LEASE_MS = 60_000


def redis_now_ms(client):
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def call_keys():
    return [lane_key(Lane.API_HEAVY), lane_key(Lane.TIER, 'preview'), lane_key(Lane.USER, 42)]


def holders(client, key):
    return sorted(member.decode() for member in client.zrange(key, 0, -1))


def test_acquire_takes_a_lease_in_every_lane_and_counts_the_calls_before_it(store, redis_client):
    keys = call_keys()
    before = redis_now_ms(redis_client)
    assert store.acquire(keys, [4, 2, 1], 'call-1', LEASE_MS, force=False) == Acquired(True, (0, 0, 0))
    after = redis_now_ms(redis_client)
    for key in keys:
        assert holders(redis_client, key) == ['call-1']
        # Scored by Redis's clock: expiry = Redis TIME + lease.
        assert before + LEASE_MS <= redis_client.zscore(key, 'call-1') <= after + LEASE_MS
        assert LEASE_MS < redis_client.pttl(key) <= 2 * LEASE_MS
    assert store.acquire(keys, [4, 2, 2], 'call-2', LEASE_MS, force=False) == Acquired(True, (1, 1, 1))
    assert store.count(keys) == [2, 2, 2]


def test_a_full_lane_refuses_without_a_lease_in_any_lane_when_not_forced(store, redis_client):
    keys = call_keys()
    store.acquire(keys, [4, 2, 1], 'call-1', LEASE_MS, force=False)
    assert store.acquire(keys, [4, 2, 1], 'call-2', LEASE_MS, force=False) == Acquired(False, (1, 1, 1))
    for key in keys:  # not even in the store that had room
        assert holders(redis_client, key) == ['call-1']


def test_a_paused_lane_refuses_every_call_not_forced(store, redis_client):
    key = lane_key(Lane.ES2_KNN)
    assert store.acquire([key], [0], 'call-1', LEASE_MS, force=False) == Acquired(False, (0,))
    assert not redis_client.exists(key)


def test_force_takes_the_leases_even_when_a_lane_is_full(store, redis_client):
    keys = call_keys()
    store.acquire(keys, [4, 2, 1], 'call-1', LEASE_MS, force=False)
    assert store.acquire(keys, [4, 2, 1], 'call-2', LEASE_MS, force=True) == Acquired(True, (1, 1, 1))
    assert store.acquire(keys, [4, 2, 1], 'call-3', LEASE_MS, force=True) == Acquired(True, (2, 2, 2))
    for key in keys:
        assert holders(redis_client, key) == ['call-1', 'call-2', 'call-3']


def test_a_stale_lease_is_pruned_and_counted_as_expired(store, redis_client):
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 7)
    live = redis_now_ms(redis_client) + LEASE_MS
    redis_client.zadd(cluster, {'dead-1': 1000, 'dead-2': 2000, 'live': live})
    redis_client.zadd(user, {'dead-1': 1000})
    assert store.expired_total() == 0
    assert store.acquire([cluster, user], [2, 1], 'call-1', LEASE_MS, force=False) == Acquired(True, (1, 0))
    assert holders(redis_client, cluster) == ['call-1', 'live']
    assert holders(redis_client, user) == ['call-1']
    assert store.expired_total() == 3
    assert int(redis_client.get(expired_key())) == 3
    # Pruned leases are gone, so a later acquire doesn't count them again.
    store.acquire([cluster, user], [4, 4], 'call-2', LEASE_MS, force=False)
    assert store.expired_total() == 3


def test_the_expired_counter_an_acquire_adds_to_follows_the_key_prefix(store, redis_client, settings, key_prefix):
    # The acquire's arguments for a set of lanes are kept encoded (Operations.encoded_lanes); the counter
    # is named by the prefix in force, even for the same lane keys acquired again under another one.
    cluster = lane_key(Lane.API_HEAVY)
    redis_client.zadd(cluster, {'dead-1': 1000})
    store.acquire([cluster], [4], 'call-1', LEASE_MS, force=False)
    assert int(redis_client.get(expired_key())) == 1
    first_counter = expired_key()
    settings.CAPACITY_KEY_PREFIX = f'{key_prefix}-b'  # under the test's own prefix: deleted with its keys
    redis_client.zadd(cluster, {'dead-2': 1000, 'dead-3': 2000})
    store.acquire([cluster], [4], 'call-2', LEASE_MS, force=False)
    assert expired_key() != first_counter
    assert int(redis_client.get(expired_key())) == 2
    assert int(redis_client.get(first_counter)) == 1


def test_past_the_bound_the_encoded_lanes_are_made_again(store, redis_client, monkeypatch):
    monkeypatch.setattr('capacity.operations.MAX_ENCODED_LANES', 2)
    for user in range(5):
        keys = [lane_key(Lane.API_HEAVY), lane_key(Lane.USER, user)]
        assert store.acquire(keys, [9, 1], f'call-{user}', LEASE_MS, force=False) == Acquired(True, (user, 0))
        assert holders(redis_client, keys[1]) == [f'call-{user}']
    assert len(store._lanes) <= 2
    assert store.acquire(keys, [9, 1], 'again', LEASE_MS, force=False) == Acquired(False, (5, 1))


def test_acquiring_again_with_the_same_token_is_idempotent(store, redis_client):
    """A redelivered task takes its leases again; its own lease must not count as a call ahead of it."""
    keys = [lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)]
    store.acquire(keys, [2, 1], 'other', LEASE_MS, force=True)
    first = store.acquire(keys, [2, 2], 'task-1', LEASE_MS, force=False)
    first_score = redis_client.zscore(keys[0], 'task-1')
    again = store.acquire(keys, [2, 2], 'task-1', LEASE_MS, force=False)
    assert first == again == Acquired(True, (1, 1))
    for key in keys:
        assert holders(redis_client, key) == ['other', 'task-1']
    assert redis_client.zscore(keys[0], 'task-1') >= first_score  # the lease runs from the latest take
    assert store.expired_total() == 0


def test_a_refused_acquire_again_leaves_the_tokens_own_lease_as_it_was(store, redis_client):
    """The acquire puts the call's lease in before it counts; a refusal takes back only what it put in."""
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)
    store.acquire([user], [1], 'task-1', LEASE_MS, force=False)
    score, ttl = redis_client.zscore(user, 'task-1'), redis_client.pttl(user)
    store.acquire([cluster], [1], 'other', LEASE_MS, force=False)
    assert store.acquire([cluster, user], [1, 1], 'task-1', LEASE_MS, force=False) == Acquired(False, (1, 0))
    assert holders(redis_client, cluster) == ['other'] and holders(redis_client, user) == ['task-1']
    assert redis_client.zscore(user, 'task-1') == score and redis_client.pttl(user) <= ttl


def test_renewal_extends_every_lease(store, redis_client):
    keys = call_keys()
    soon = redis_now_ms(redis_client) + 5000
    for key in keys:
        redis_client.zadd(key, {'call-1': soon})
    assert store.renew(keys, 'call-1', LEASE_MS) == 3
    now = redis_now_ms(redis_client)
    for key in keys:
        assert redis_client.zscore(key, 'call-1') > now + LEASE_MS - 1000


def test_renewal_with_one_lease_expired_renews_none_and_revives_nothing(store, redis_client):
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)
    soon = redis_now_ms(redis_client) + 5000
    redis_client.zadd(cluster, {'call-1': soon})
    redis_client.zadd(user, {'call-1': 1000})
    assert store.renew([cluster, user], 'call-1', LEASE_MS) == 1
    assert redis_client.zscore(cluster, 'call-1') == soon
    assert redis_client.zscore(user, 'call-1') == 1000


def test_renewal_never_re_adds_a_deleted_key(store, redis_client):
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)
    store.acquire([cluster, user], [4, 1], 'call-1', LEASE_MS, force=False)
    score = redis_client.zscore(cluster, 'call-1')
    redis_client.delete(user)
    assert store.renew([cluster, user], 'call-1', LEASE_MS * 2) == 1
    assert not redis_client.exists(user)
    assert redis_client.zscore(cluster, 'call-1') == score


def test_a_short_lease_never_shortens_a_lanes_ttl(store, redis_client):
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)
    redis_client.zadd(cluster, {'long-call': redis_now_ms(redis_client) + 600_000})
    redis_client.pexpire(cluster, 1_200_000)
    store.acquire([cluster, user], [4, 1], 'call-1', LEASE_MS, force=False)
    assert redis_client.pttl(cluster) > 600_000
    assert LEASE_MS < redis_client.pttl(user) <= 2 * LEASE_MS
    assert store.renew([cluster, user], 'call-1', LEASE_MS) == 2
    assert redis_client.pttl(cluster) > 600_000
    # A key without a TTL gets one (PTTL -1 is below any lease).
    redis_client.persist(user)
    assert store.renew([cluster, user], 'call-1', LEASE_MS) == 2
    assert LEASE_MS < redis_client.pttl(user) <= 2 * LEASE_MS


def test_release_removes_only_its_own_token_and_a_second_release_is_harmless(store, redis_client):
    keys = call_keys()
    store.acquire(keys, [4, 4, 4], 'call-1', LEASE_MS, force=False)
    store.acquire(keys, [4, 4, 4], 'call-2', LEASE_MS, force=False)
    assert store.release(keys, 'call-1') == 3
    for key in keys:
        assert holders(redis_client, key) == ['call-2']
    assert store.release(keys, 'call-1') == 0
    assert store.count(keys) == [1, 1, 1]


def test_a_release_measures_how_long_each_lane_held_the_lease_by_redis_clock(store, redis_client):
    keys = call_keys()
    taken = store.acquire(keys, [4, 4, 4], 'call-1', LEASE_MS, force=False)
    assert abs(taken.acquired_ms - redis_now_ms(redis_client)) < 1000  # Redis's clock, not this host's
    # As if the lease had been taken 2 s ago: the hold is Redis's now minus the acquire's now.
    before = redis_now_ms(redis_client)
    assert store.release(keys, 'call-1', acquired_ms=before - 2000) == 3
    after = redis_now_ms(redis_client)
    holds = store.holds()
    assert set(holds) == {'api_heavy', 'tier:preview', 'user'}  # every user's lane is one field
    for field in holds.values():
        assert 2000 <= field <= after - before + 2000
    assert int(redis_client.hget(holds_key(), 'user|n')) == 1
    # A second release removes nothing, so it measures nothing.
    assert store.release(keys, 'call-1', acquired_ms=before - 9000) == 0
    assert store.holds() == holds and int(redis_client.hget(holds_key(), 'user|n')) == 1


def test_a_lanes_mean_hold_is_the_plain_mean_at_first_then_weighs_the_newest_a_fifth(store, redis_client):
    key = lane_key(Lane.ES2_KNN)
    means = []
    for n, held_ms in enumerate([1000, 3000, 2000, 7000, 2000, 2000]):
        store.acquire([key], [9], f'call-{n}', LEASE_MS, force=False)
        now = redis_now_ms(redis_client)
        store.release([key], f'call-{n}', acquired_ms=now - held_ms)
        means.append(store.holds()['es2_knn'])
    # Samples land a few ms late (the release runs after `now` was read), so allow that much.
    expected = [1000, 2000, 2000, 3250, 3000, 2800]
    assert all(0 <= mean - want <= 25 for mean, want in zip(means, expected)), means


def test_lanes_of_one_field_each_count_in_its_mean_hold(store, redis_client):
    """Every user's lane is one field: a call in two of them adds two samples, as two releases would."""
    users = [lane_key(Lane.USER, 1), lane_key(Lane.USER, 2)]
    store.acquire(users, [9, 9], 'call-1', LEASE_MS, force=False)
    now = redis_now_ms(redis_client)
    assert store.release(users, 'call-1', acquired_ms=now - 1000, ran=('es2_knn', 300)) == 2
    assert int(redis_client.hget(holds_key(), 'user|n')) == 2
    assert store.holds() == {'user': pytest.approx(1000, abs=25), run_field('es2_knn'): 300}


def test_a_release_without_an_acquire_time_measures_no_hold_and_a_run_is_per_queue(store, redis_client):
    keys = call_keys()
    store.acquire(keys, [4, 4, 4], 'call-1', LEASE_MS, force=False)
    assert store.release(keys, 'call-1', acquired_ms=0, ran=('es2_knn', 1234)) == 3
    assert store.holds() == {run_field('es2_knn'): 1234}
    assert hold_field(keys[0]) == 'api_heavy'


def test_a_release_of_a_call_over_the_limit_measures_its_run_but_no_hold(store, redis_client):
    keys = call_keys()
    store.acquire(keys, [1, 1, 1], 'admitted', LEASE_MS, force=False)
    over = store.acquire(keys, [1, 1, 1], 'over', LEASE_MS, force=True)  # shadow mode lets it past
    now = redis_now_ms(redis_client)
    assert store.release(keys, 'over', acquired_ms=now - 30_000, ran=('es2_knn', 400), within_limit=False) == 3
    assert store.holds() == {run_field('es2_knn'): 400}  # its 30 s were a wait no refused caller makes
    assert over.acquired_ms > 0 and store.release(keys, 'admitted', acquired_ms=now - 500) == 3
    assert {field: hold for field, hold in store.holds().items() if field != run_field('es2_knn')} == {
        'api_heavy': pytest.approx(500, abs=25), 'tier:preview': pytest.approx(500, abs=25),
        'user': pytest.approx(500, abs=25)}


def test_an_acquire_that_finds_a_lane_full_reads_every_lanes_mean_hold(store, redis_client):
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)
    redis_client.hset(holds_key(), mapping={'api_heavy': 2500})
    room = store.acquire([cluster, user], [2, 2], 'call-1', LEASE_MS, force=False)
    assert room == Acquired(True, (0, 0)) and room.holds == ()  # nothing full: nothing read
    full = store.acquire([cluster, user], [1, 2], 'call-2', LEASE_MS, force=False)
    assert full == Acquired(False, (1, 1))
    assert full.holds == (2500, None)  # the user lane has no measurement yet


def test_unclaim_removes_a_claim_only_for_its_holder_and_can_leave_a_pointer(store, redis_client):
    claim, pointer = work_claim_key('w1'), warm_key('w1')
    redis_client.set(claim, 'call-2', px=LEASE_MS)
    assert store.unclaim(claim, 'call-1') is False  # another call took it since: left alone
    assert redis_client.get(claim) == b'call-2'
    assert store.unclaim(claim, 'call-2', pointer, 1500) is True
    assert redis_client.get(claim) is None
    assert redis_client.get(pointer) == b'call-2' and 0 < redis_client.pttl(pointer) <= 1500
    assert store.unclaim(claim, 'call-2') is False  # a second time: nothing to give up
    assert store.unclaim(claim, 'call-3', warm_key('w2'), 0) is False
    assert redis_client.exists(warm_key('w2')) == 0  # no pointer for 0 ms
    with pytest.raises(redis.ResponseError, match='pointer_ms'):
        store.runner.operate(store.run_script, 'unclaim', [claim, pointer], ['call-2', -1])


def test_keep_extends_a_claim_that_exists_and_can_shrink_what_it_holds(store, redis_client):
    claim = work_claim_key('w9')
    assert store.keep(claim, 60) is False and redis_client.exists(claim) == 0  # nothing to keep: none made
    redis_client.set(claim, 'call-1', px=LEASE_MS)
    assert store.keep(claim, 3600) is True
    assert redis_client.get(claim) == b'call-1' and redis_client.ttl(claim) > 3500
    assert store.keep(claim, 86400, '1') is True
    assert redis_client.get(claim) == b'1' and redis_client.ttl(claim) > 86300
    redis_client.delete(claim)
    assert store.keep(claim, 60, '1') is False and redis_client.exists(claim) == 0


def test_release_and_end_releases_announces_and_ends_the_work_in_one_round_trip(store, redis_client):
    keys = call_keys()
    claim, pointer = work_claim_key('w5'), warm_key('w5')
    store.acquire(keys, [4, 4, 4], 'call-1', LEASE_MS, force=False)
    redis_client.set(claim, 'call-1', px=LEASE_MS)
    listener = redis_client.pubsub()
    listener.subscribe('notice-test')
    assert listener.get_message(timeout=1)['type'] == 'subscribe'
    sent = []
    real_pipeline = redis.client.Redis.pipeline

    def counted(client, *args, **kwargs):
        pipe = real_pipeline(client, *args, **kwargs)
        real_execute = pipe.execute
        pipe.execute = lambda **kw: sent.append(len(pipe.command_stack)) or real_execute(**kw)
        return pipe
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.client.Redis, 'pipeline', counted)
        answer = store.release_and_end(keys, 'call-1', ran=('es2_knn', 40), notice=('notice-test', 'succeeded'),
                                       work=(claim, 'call-1', pointer, 1500))
    assert sent == [3]  # one pipeline of three commands: one round trip
    assert answer == Ended(removed=3, published=1, unclaimed=1)  # PUBLISH answers how many heard it
    assert store.count(keys) == [0, 0, 0] and store.holds()[run_field('es2_knn')] == 40
    assert redis_client.get(claim) is None
    assert redis_client.get(pointer) == b'call-1'
    assert listener.get_message(timeout=1)['data'] == b'succeeded'
    listener.close()
    # Nothing left to release and no work: the notice alone (PUBLISH answers how many heard it).
    assert store.release_and_end([], 'call-1', notice=('notice-test', 'x')) == Ended(published=0)


def test_release_and_end_all_ends_many_runs_in_one_round_trip(store, redis_client):
    keys = call_keys()
    claim = work_claim_key('w7')
    for token in ('call-1', 'call-2'):
        store.acquire(keys, [4, 4, 4], token, LEASE_MS, force=False)
    redis_client.set(claim, 'call-2', px=LEASE_MS)
    sent = []
    real_pipeline = redis.client.Redis.pipeline

    def counted(client, *args, **kwargs):
        pipe = real_pipeline(client, *args, **kwargs)
        real_execute = pipe.execute
        pipe.execute = lambda **kw: sent.append(len(pipe.command_stack)) or real_execute(**kw)
        return pipe
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.client.Redis, 'pipeline', counted)
        answers = store.release_and_end_all([
            (keys, 'call-1', 0, None, ('notice-test', 'cancelled'), None, True),
            (keys, 'call-2', 0, None, ('notice-test', 'cancelled'), (claim, 'call-2', warm_key('w7'), 0), True)])
    assert sent == [5]  # both ends' commands in one pipeline
    assert answers == [Ended(removed=3, published=0), Ended(removed=3, published=0, unclaimed=1)]
    assert store.count(keys) == [0, 0, 0] and redis_client.get(claim) is None
    assert store.release_and_end_all([]) == []


def test_release_and_end_loads_a_script_redis_lost_and_reports_a_failed_step_alone(store, redis_client):
    keys = call_keys()
    store.acquire(keys, [4, 4, 4], 'call-1', LEASE_MS, force=False)
    redis_client.script_flush()  # as after a restart: EVALSHA finds neither script
    claim = work_claim_key('w6')
    ended = store.release_and_end(keys, 'call-1', work=(claim, 'call-1', warm_key('w6'), 0))
    assert ended == Ended(removed=3, unclaimed=0)
    assert store.count(keys) == [0, 0, 0]
    redis_client.hset(claim, 'x', 1)  # GET on a hash is a WRONGTYPE error: only the work step fails
    store.acquire(keys, [4, 4, 4], 'call-2', LEASE_MS, force=False)
    ended = store.release_and_end(keys, 'call-2', work=(claim, 'call-2', warm_key('w6'), 0))
    assert ended.removed == 3 and isinstance(ended.unclaimed, redis.ResponseError)


def test_count_ignores_expired_leases_and_changes_nothing(store, redis_client):
    cluster, user = lane_key(Lane.API_HEAVY), lane_key(Lane.USER, 42)
    redis_client.zadd(cluster, {'dead': 1000, 'live': redis_now_ms(redis_client) + LEASE_MS})
    assert store.count([cluster, user]) == [1, 0]
    assert redis_client.zcard(cluster) == 2  # not pruned
    assert not redis_client.exists(user)
    assert store.expired_total() == 0


def test_find_keys_lists_the_keys_of_one_lane_sorted(store, redis_client, settings, key_prefix):
    for key in [lane_key(Lane.USER, 2), lane_key(Lane.USER, 10), lane_key(Lane.USER, 1),
                lane_key(Lane.API_HEAVY), lane_key(Lane.API_HEAVY_TASK, 'web-1'), lane_key('user_x', 3)]:
        redis_client.zadd(key, {'call': 1})
    found = store.find_keys(Lane.USER)
    assert found == sorted(found)
    assert [lane_id(key) for key in found] == ['1', '10', '2']
    assert [lane_id(key) for key in store.find_keys('api_heavy_task')] == ['web-1']
    assert store.find_keys(Lane.ES2_KNN) == []


def test_find_keys_reads_glob_characters_in_the_prefix_literally(store, redis_client, settings, key_prefix):
    settings.CAPACITY_KEY_PREFIX = f'{key_prefix}[ab]*'
    redis_client.zadd(lane_key(Lane.USER, 1), {'call': 1})
    redis_client.zadd(f'{{{key_prefix}a}}:user:9', {'call': 1})  # the unescaped pattern would match this
    assert store.find_keys(Lane.USER) == [f'{{{key_prefix}[ab]*}}:user:1']


def test_an_acquire_redis_runs_too_late_takes_no_lease_in_any_lane(store, redis_client):
    keys = call_keys()
    redis_client.zadd(keys[0], {'dead': 1000})
    late = redis_now_ms(redis_client) - 1
    for force in (False, True):
        with pytest.raises(redis.TimeoutError, match=LATE_ACQUIRE):
            store.acquire(keys, [4, 2, 1], 'call-1', LEASE_MS, force=force, not_after_ms=late)
    assert [redis_client.exists(key) for key in keys] == [1, 0, 0]
    assert holders(redis_client, keys[0]) == ['dead']  # it returned before touching anything
    assert store.expired_total() == 0


def test_a_script_redis_no_longer_has_is_loaded_again(key_prefix):
    """EVALSHA falls back to loading the script. On fakeredis only: SCRIPT FLUSH on the shared Redis would
    empty everyone's script cache (test_faults restarts a redis-server of its own for the real case)."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    use_store(LaneStore(client))
    try:
        key = lane_key(Lane.API_HEAVY)
        store = get_store().ops
        store.acquire([key], [4], 'call-1', LEASE_MS, force=False)
        client.script_flush()
        assert store.acquire([key], [4], 'call-2', LEASE_MS, force=False) == Acquired(True, (1,))
    finally:
        use_store(None)
        client.close()


def test_calls_that_make_no_sense_are_refused_before_they_take_anything(store, redis_client):
    key = lane_key(Lane.API_HEAVY)
    with pytest.raises(ValueError):
        store.acquire([key], [1, 2], 'call-1', LEASE_MS, force=False)
    with pytest.raises(ValueError):
        store.acquire([], [], 'call-1', LEASE_MS, force=False)
    with pytest.raises(ValueError):
        store.renew([], 'call-1', LEASE_MS)
    assert store.release([], 'call-1') == 0
    assert store.count([]) == []
    # The script checks its own arguments too: a lease of 0 ms would be a lease that never counts.
    with pytest.raises(redis.ResponseError, match='lease_ms > 0'):
        store.runner.operate(store.run_script, 'acquire', [key, expired_key(), holds_key()],
                      ['call-1', 0, '0', 2**50, 4, 'api_heavy'])
    with pytest.raises(redis.ResponseError, match='one limit and one hold field per lane'):
        store.runner.operate(store.run_script, 'acquire', [key, expired_key(), holds_key()],
                      ['call-1', LEASE_MS, '0', 2**50, 4])
    with pytest.raises(redis.ResponseError, match='0 < weight <= 1'):
        store.runner.operate(store.run_script, 'release', [key, holds_key()], ['call-1', 0, '1', 0, '', 0, 'api_heavy'])
    assert not redis_client.exists(key)

