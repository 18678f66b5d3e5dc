"""The gate on both lane stores (fakeredis with real Lua, and the real Redis): LIMITER.md §8 CapacityGateTest,
adapted where DESIGN.md changes the behaviour (api_heavy_task only for calls that wait in the request; the
single-row reserve in every lane a single-row call takes; a queued call's lease lasts its queue deadline).
"""
import json
import time
from unittest import mock

import pytest
import redis

from capacity import decisions, gate as capacity_gate
from capacity.admission import headers, log_record, refusal_body
from capacity.caller import RequestFacts
from capacity.constants import Decision, Lane
from capacity.keys import holds_key, lane_key
from capacity.operations import Operations
from capacity.store import get_store

pytestmark = pytest.mark.usefixtures('lanes')


def zcard(client, lane, *parts):
    return client.zcard(lane_key(lane, *parts))


def test_admits_and_counts_a_call_in_every_lane(make_user, gates, lanes):
    user = make_user('early_access')
    gate = gates(user, waits=True)
    assert gate.decision == Decision.ADMITTED and gate.holding
    assert gate.limits == {Lane.API_HEAVY: 3, Lane.ES2_KNN: 2, Lane.TIER: 3, Lane.USER: 2}
    assert set(gate.counts.values()) == {1}
    for key in gate.keys:
        assert lanes.zcard(key) == 1
        assert lanes.pttl(key) > 0
    capacity_gate.release(gate)
    assert [lanes.zcard(key) for key in gate.keys] == [0] * 4
    capacity_gate.release(gate)  # a second release is harmless


def test_shadow_mode_never_refuses_but_says_it_would_have(make_user, gates):
    user = make_user()
    gates(user)
    second = gates(user)
    assert second.decision == Decision.SHADOW_REFUSED and second.holding and not second.refused
    assert second.full == (Lane.USER,)
    assert second.counts[Lane.USER] == 2
    assert second.retry_after == 5


def test_enforce_mode_refuses_without_taking_a_lease(make_user, gates, configure, lanes):
    configure(mode='enforce', enforce_for='all')
    user = make_user()
    first = gates(user)
    second = gates(user)
    assert second.refused and not second.holding
    assert second.counts[Lane.USER] == 1
    assert zcard(lanes, Lane.USER, user.pk) == 1
    assert refusal_body(second) == {
        'detail': 'Matching is busy. Please retry in 5 seconds.', 'error_code': 'capacity_exceeded',
        'scope': 'user', 'paused': False, 'retry_after': 5}
    capacity_gate.release(first)
    assert gates(user).decision == Decision.ADMITTED


def test_enforce_for_aware_refuses_only_clients_that_say_they_handle_it(make_user, gates, configure):
    configure(mode='enforce')
    user = make_user()
    gates(user)
    unaware = gates(user)
    aware = gates(user, metadata={'capacity_aware': 'true'})
    assert unaware.decision == Decision.SHADOW_REFUSED and not unaware.enforced
    assert aware.decision == Decision.REFUSED and aware.enforced


def test_a_stale_lease_expires(make_user, gates, lanes):
    user = make_user()
    key = lane_key(Lane.USER, user.pk)
    lanes.zadd(key, {'dead': 1000})
    gate = gates(user)
    assert gate.decision == Decision.ADMITTED
    assert lanes.zrange(key, 0, -1) == [gate.token.encode()]
    assert get_store().expired_total() == 1


def test_single_row_calls_can_use_the_reserved_slot(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', api_heavy={'cluster': 2, 'per_task': 2},
              tiers={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9},
              per_user={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9}, reserve_single_row=1)
    user = make_user()
    assert gates(user, semantic=False, reranker=True).limits[Lane.API_HEAVY] == 1
    assert gates(user, semantic=False, reranker=True).scope == Lane.API_HEAVY
    single = gates(user, rows=1, semantic=False, reranker=True)
    assert single.limits[Lane.API_HEAVY] == 2 and single.decision == Decision.ADMITTED
    assert gates(user, endpoint='$rerank', rows=1, semantic=False).refused


def test_the_reserve_holds_in_the_es2_knn_lane_too(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', es2_knn=2,
              per_user={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9})
    user = make_user('core_user')
    assert gates(user).limits[Lane.ES2_KNN] == 1
    assert gates(user).scope == Lane.ES2_KNN
    single = gates(user, rows=1)
    assert single.decision == Decision.ADMITTED and single.limits[Lane.ES2_KNN] == 2


@pytest.mark.parametrize('mode', ['shadow', 'enforce'])
def test_each_api_host_has_its_own_waiting_slots_and_they_are_never_forced(
        mode, make_user, gates, configure, settings):
    configure(mode=mode, enforce_for='all', api_heavy={'cluster': 4, 'per_task': 2})
    user = make_user('core_user')
    settings.CAPACITY_TASK_ID = 'host-a'
    slots = [gates(user, endpoint='$match', rows=1, wait_slot=True, lease_ms=60_000) for _ in range(3)]
    assert [slot.decision for slot in slots] == [Decision.ADMITTED, Decision.ADMITTED, Decision.REFUSED]
    assert slots[2].limits == {Lane.API_HEAVY_TASK: 2} and not slots[2].holding  # shadow mode too
    settings.CAPACITY_TASK_ID = 'host-b'
    assert gates(user, endpoint='$match', rows=1, wait_slot=True, lease_ms=60_000).decision == Decision.ADMITTED


@pytest.mark.parametrize('mode', ['shadow', 'enforce'])
def test_a_host_full_of_bulk_waits_still_holds_a_single_row_calls_wait(mode, make_user, gates, configure):
    configure(mode=mode, enforce_for='all', reserve_single_row=1, api_heavy={'cluster': 4, 'per_task': 3})
    user = make_user('core_user')
    bulk = [gates(user, endpoint='$match', rows=20, wait_slot=True, lease_ms=60_000) for _ in range(3)]
    assert [slot.decision for slot in bulk] == [Decision.ADMITTED, Decision.ADMITTED, Decision.REFUSED]
    assert bulk[2].limits == {Lane.API_HEAVY_TASK: 2}  # per_task - the reserve
    single = gates(user, endpoint='$match', rows=1, wait_slot=True, lease_ms=60_000)
    assert single.decision == Decision.ADMITTED and single.limits == {Lane.API_HEAVY_TASK: 3}
    assert gates(user, endpoint='$match', rows=1, wait_slot=True, lease_ms=60_000).decision == Decision.REFUSED
    assert Lane.API_HEAVY_TASK not in gates(user, semantic=False, reranker=True, waits=True).limits


def test_tier_ceilings_leave_other_tiers_alone(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', per_user={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9},
              api_heavy={'cluster': 20, 'per_task': 20}, es2_knn=20)
    previews = [make_user() for _ in range(3)]
    gates(previews[0]), gates(previews[1])
    third = gates(previews[2])
    assert third.refused and third.scope == Lane.TIER and third.counts[Lane.TIER] == 2
    early = gates(make_user('early_access'))
    assert early.decision == Decision.ADMITTED and early.counts[Lane.TIER] == 1


def test_a_lane_resized_between_two_calls_applies_to_the_second(make_user, gates, configure):
    # The gate reuses a call's lanes and limits while the config stays the same (capacity.plans).
    configure(mode='enforce', enforce_for='all')
    user = make_user()
    gates(user)
    assert gates(user).refused
    configure(per_user={'preview': 2})  # a staff resize: the config cache is cleared in this process
    second = gates(user)
    assert second.decision == Decision.ADMITTED and second.limits[Lane.USER] == 2
    configure(mode='shadow', per_user={'preview': 1}, tiers={'preview': 5})
    third = gates(user)
    assert third.decision == Decision.SHADOW_REFUSED and third.limits[Lane.USER] == 1
    assert third.limits[Lane.TIER] == 5


def test_only_semantic_calls_take_an_es2_knn_lane(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', es2_knn=2, per_user={'staff': 9, 'core': 9, 'early_access': 9,
                                                                       'preview': 9})
    user = make_user('core_user')
    gates(user)
    assert gates(user).scope == Lane.ES2_KNN
    lexical = gates(user, semantic=False, reranker=True)
    assert Lane.ES2_KNN not in lexical.limits and lexical.decision == Decision.ADMITTED


def test_a_paused_tier(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', tiers={'staff': 4, 'core': 4, 'early_access': 3, 'preview': 0})
    gate = gates(make_user())
    assert gate.refused and gate.scope == Lane.TIER and gate.retry_after == 120 and gate.suggested == 0
    assert refusal_body(gate)['paused'] is True


def test_a_paused_lane_is_the_scope_reported(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', api_heavy={'cluster': 2, 'per_task': 2}, reserve_single_row=1,
              tiers={'staff': 4, 'core': 4, 'early_access': 3, 'preview': 0})
    gates(make_user('core_user'), semantic=False, reranker=True)  # fills the one bulk slot
    gate = gates(make_user(), semantic=False, reranker=True)
    assert gate.full == (Lane.API_HEAVY, Lane.TIER)
    assert gate.scope == Lane.TIER
    body = refusal_body(gate)
    assert (body['scope'], body['paused'], body['retry_after']) == ('tier', True, 120)


def test_retry_after_grows_with_the_calls_ahead_up_to_the_max(make_user, gates, configure):
    configure(mode='shadow', api_heavy={'cluster': 10, 'per_task': 10},
              tiers={'staff': 99, 'core': 99, 'early_access': 99, 'preview': 99},
              per_user={'staff': 99, 'core': 99, 'early_access': 99, 'preview': 99})
    user = make_user('core_user')
    for _ in range(8):
        gates(user, semantic=False, reranker=True)
    assert [gates(user, semantic=False, reranker=True).retry_after for _ in range(4)] == [None, 5, 10, 15]
    configure(retry_after={'base': 5, 'max': 12, 'paused': 120})
    assert gates(user, semantic=False, reranker=True).retry_after == 12


def test_retry_after_is_the_measured_time_until_enough_leases_are_freed(make_user, gates, configure, lanes):
    configure(mode='enforce', enforce_for='all', api_heavy={'cluster': 5, 'per_task': 10},
              tiers={'staff': 99, 'core': 99, 'early_access': 99, 'preview': 99},
              per_user={'staff': 99, 'core': 99, 'early_access': 99, 'preview': 99})
    user = make_user('core_user')
    held = [gates(user, semantic=False, reranker=True) for _ in range(4)]  # the bulk share of 5, minus 1
    assert all(call.decision == Decision.ADMITTED for call in held)
    # Nothing measured yet: the seed's 5 s per call ahead.
    assert gates(user, semantic=False, reranker=True).retry_after == 5
    # Each lease of api_heavy is held 6 s on average: 4 leases free one slot every 1.5 s, rounded up to 2.
    lanes.hset(holds_key(), mapping={'api_heavy': 6000})
    refused = gates(user, semantic=False, reranker=True)
    assert refused.refused and refused.retry_after == 2
    assert refusal_body(refused)['retry_after'] == 2 and headers(refused)['Retry-After'] == '2'
    # A measured hold that short still waits the configured minimum; a long one at most the maximum.
    lanes.hset(holds_key(), mapping={'api_heavy': 40})
    assert gates(user, semantic=False, reranker=True).retry_after == 1
    lanes.hset(holds_key(), mapping={'api_heavy': 600_000})
    assert gates(user, semantic=False, reranker=True).retry_after == 30
    # Turned off, the seed's formula answers again.
    configure(retry_after={'measured': 0})
    assert gates(user, semantic=False, reranker=True).retry_after == 5


def test_the_gates_own_releases_are_measured(make_user, gates, lanes):
    user = make_user('core_user')
    call = gates(user)
    assert call.acquired_ms > 0
    time.sleep(0.05)
    capacity_gate.release(call)
    holds = get_store().holds()
    assert set(holds) == {'api_heavy', 'es2_knn', 'tier:core', 'user'}
    assert all(40 <= hold < 5000 for hold in holds.values()), holds


def test_suggested_concurrency(make_user, gates, configure):
    configure(es2_knn=9, api_heavy={'cluster': 4, 'per_task': 4})
    assert gates(make_user('core_user')).suggested == 3
    assert gates(make_user('core_user')).suggested == 2
    assert gates(make_user()).suggested == 1
    assert decisions.suggested_concurrency({}, {}) is None


def test_the_waiting_room_admits_that_many_beyond_the_limit(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all', es2_knn=2,
              per_user={'staff': 9, 'core': 9, 'early_access': 9, 'preview': 9},
              queue={'deadline_seconds': 600, 'max_waiting': {'interactive': 0, 'es2_knn': 2, 'api_heavy': 0}})
    user = make_user('core_user')
    decided = [gates(user, queue='es2_knn').decision for _ in range(4)]
    assert decided == [Decision.ADMITTED] * 3 + [Decision.REFUSED]  # 1 slot + 2 waiting, then refused


def test_a_queued_call_holds_its_leases_until_its_queue_deadline(make_user, gates, lanes):
    gate = gates(make_user(), queue='es2_knn')
    now_ms = lanes.time()[0] * 1000
    score = lanes.zscore(gate.keys[0], gate.token)
    assert 599_000 <= score - now_ms <= 601_000


def test_redis_failure_fails_open_and_skips_redis_for_a_while(make_user, gates):
    user = make_user()
    broken = mock.Mock(side_effect=redis.ConnectionError('refused'))
    with mock.patch.object(Operations, 'acquire', broken):
        gate = gates(user)
        assert gate.decision == Decision.UNAVAILABLE and not gate.holding
        assert gate.error == 'ConnectionError: refused'
        assert not get_store().is_available()
        skipped = gates(user)
        assert skipped.decision == Decision.UNAVAILABLE and broken.call_count == 1
        assert skipped.suggested == 1
        assert HEADERS_WITHOUT_COUNTS <= set(headers(skipped))
        get_store().unavailable_until = 0
        gates(user)
        assert broken.call_count == 2


HEADERS_WITHOUT_COUNTS = {'X-OCL-Capacity-Decision', 'X-OCL-Capacity-Limit', 'X-OCL-Capacity-Tier',
                          'X-OCL-Capacity-Tier-Limit', 'X-OCL-Capacity-Suggested-Concurrency'}


def test_an_acquire_that_redis_runs_too_late_takes_no_lease(make_user, gates, lanes):
    with mock.patch('capacity.operations.get_not_after_ms', return_value=int(time.time() * 1000) - 10_000):
        gate = gates(make_user())
    assert gate.decision == Decision.UNAVAILABLE and not gate.holding
    assert 'no lease was taken' in gate.error
    assert all(lanes.zcard(key) == 0 for key in gate.keys)


def test_an_error_after_a_refusal_never_refuses(make_user, gates, configure):
    configure(mode='enforce', enforce_for='all')
    user = make_user()
    gates(user)
    with mock.patch('capacity.decisions.retry_after', side_effect=RuntimeError('boom')):
        gate = gates(user)
    assert gate.decision == Decision.UNAVAILABLE and not gate.refused and gate.retry_after is None


def test_an_error_after_the_leases_were_taken_keeps_them_in_the_admission_so_they_are_released(
        make_user, gates, lanes):
    with mock.patch('capacity.decisions.decide', side_effect=RuntimeError('boom')):
        gate = gates(make_user())
    assert gate.decision == Decision.UNAVAILABLE and gate.error == 'RuntimeError: boom'
    assert gate.holding and gate.acquired_ms > 0 and all(lanes.zcard(key) == 1 for key in gate.keys)
    capacity_gate.release(gate)
    assert all(lanes.zcard(key) == 0 for key in gate.keys)


def test_an_unexpected_error_fails_open(make_user, gates):
    with mock.patch('capacity.gate.get_tier', side_effect=KeyError('tier')):
        gate = gates(make_user())
    assert gate.decision == Decision.UNAVAILABLE and gate.error == "KeyError: 'tier'"
    assert get_store().is_available()  # not a Redis error: the skip window stays shut
    assert log_record(gate)['decision'] == 'unavailable'


def test_off_mode_does_nothing(make_user, gates, configure):
    configure(mode='off')
    with mock.patch.object(Operations, 'acquire') as acquire:
        gate = gates(make_user())
    acquire.assert_not_called()
    assert gate.decision is None and headers(gate) == {} and log_record(gate) is None


def test_headers(make_user, gates, configure):
    user = make_user()
    gate = gates(user)
    assert headers(gate) == {
        'X-OCL-Capacity-Decision': 'admitted', 'X-OCL-Capacity-Limit': '3', 'X-OCL-Capacity-In-Flight': '1',
        'X-OCL-Capacity-Tier': 'preview', 'X-OCL-Capacity-Tier-Limit': '2', 'X-OCL-Capacity-Tier-In-Flight': '1',
        'X-OCL-Capacity-Suggested-Concurrency': '1'}
    configure(mode='enforce', enforce_for='all')
    refused = gates(user)
    assert headers(refused)['X-OCL-Capacity-Decision'] == 'refused'
    assert headers(refused)['Retry-After'] == '5'
    assert 'Retry-After' not in headers(gate)
    assert headers(None) == {}


def test_the_log_record(make_user, gates, settings):
    settings.CAPACITY_TASK_ID = 'host-a'
    user = make_user()
    gates(user)
    stamp = format(int(time.time()) - 3, 'x')
    facts = RequestFacts.from_meta({
        'HTTP_X_OCL_EVENT_METADATA': json.dumps({'algorithm_id': 'a' * 150, 'automatch_run_id': 'r' * 30}),
        'HTTP_X_AMZN_TRACE_ID': f'Root=1-{stamp}-abcdef', 'HTTP_X_OCL_REQUEST_SOURCE': 'automatch'})
    gate = gates(user, rows=25, semantic=False, reranker=True, queue='api_heavy', facts=facts)
    record = log_record(gate)
    assert record['queue_ms'] >= 3000
    del record['queue_ms']
    assert record == {
        'event': 'ocl_capacity', 'decision': 'shadow-refused', 'mode': 'shadow', 'enforced': False,
        'endpoint': '$match', 'semantic': False, 'reranker': True, 'rows': 25, 'single_row': False,
        'waits': None, 'tier': 'preview', 'user_id': user.pk, 'scope': 'user', 'full': ['user'],
        'in_flight': 2, 'limit': 3, 'task_in_flight': None, 'task_limit': None, 'es2_knn_in_flight': None,
        'es2_knn_limit': None, 'tier_in_flight': 2, 'tier_limit': 2, 'user_in_flight': 2, 'user_limit': 1,
        'suggested': 1, 'retry_after': 5, 'error': None, 'host': 'host-a', 'request_source': 'automatch',
        'algorithm_id': 'a' * 100, 'automatch_run_id': 'r' * 30, 'cid': None, 'request_id': None,
        'task_id': gate.token}


def test_status(make_user, gates, settings):
    from capacity.config import get_config
    from capacity.status import get_status
    preview, core = make_user(), make_user('core_user')
    gates(preview)  # semantic
    settings.CAPACITY_TASK_ID = 'task-a'
    gates(core, semantic=False, reranker=True, waits=True)
    gates(core, wait_slot=True, lease_ms=60_000)  # its request waits for the result
    status = get_status(get_config())
    status.pop('queues', None)  # the sections other apps add (workers: queues, indexes) have tests of their own
    status.pop('indexes', None)
    assert status == {
        'mode': 'shadow', 'enforce_for': 'aware', 'redis': 'ok',
        'api_heavy': {'in_flight': 2, 'limit': 4, 'bulk_limit': 3},
        'es2_knn': {'in_flight': 1, 'limit': 3, 'bulk_limit': 2},
        'tasks': {'task-a': {'in_flight': 1, 'limit': 64}},
        'tiers': {'staff': {'in_flight': 0, 'limit': 4}, 'core': {'in_flight': 1, 'limit': 4},
                  'early_access': {'in_flight': 0, 'limit': 3}, 'preview': {'in_flight': 1, 'limit': 2}},
        'users': {str(preview.pk): {'in_flight': 1}, str(core.pk): {'in_flight': 1}},
        'leases_expired_total': 0,
    }
    with mock.patch.object(Operations, 'find_keys', side_effect=redis.ConnectionError('down')):
        broken = get_status(get_config())
    assert broken['redis'] == 'ConnectionError: down' and 'api_heavy' not in broken


def test_the_command_shows_the_status(make_user, gates):
    import json as json_module
    from io import StringIO

    from django.core.management import call_command
    gates(make_user())
    out = StringIO()
    call_command('capacity', 'status', stdout=out)
    assert json_module.loads(out.getvalue())['api_heavy']['in_flight'] == 1


def test_counters_gather_and_reach_redis_without_holding_the_redis_threads_queue(lanes):
    import time as time_module

    from capacity import counters
    for _ in range(50):  # far more than the thread's 8 queue places
        counters.increment(('decision', 'es2_knn', 'core', 'admitted'), ('full', 'user', 'core', 'refused'))
    deadline = time_module.monotonic() + 5
    while time_module.monotonic() < deadline:
        values = counters.read()
        if values.get(('decision', 'es2_knn', 'core', 'admitted')) == 50:
            break
        time_module.sleep(0.01)
    assert values[('decision', 'es2_knn', 'core', 'admitted')] == 50
    assert values[('full', 'user', 'core', 'refused')] == 50


def test_counters_made_within_the_gathering_time_reach_redis_together_once_it_passed(lanes, settings,
                                                                                      monkeypatch):
    import time as time_module

    from capacity import counters
    from capacity.store import get_store
    settings.CAPACITY_COUNTERS_GATHER_SECONDS = 0.3
    store, jobs = get_store(), []
    queue_job = store.add_counts_later
    monkeypatch.setattr(store, 'add_counts_later', lambda take: jobs.append(take) or queue_job(take))
    started = time_module.monotonic()
    for _ in range(20):
        counters.increment(('served', 'es2_knn', 'run'))
    field = ('served', 'es2_knn', 'run')
    values = counters.read()
    assert field not in values or time_module.monotonic() - started >= 0.3  # not sent before the time passed
    deadline = started + 5
    while values.get(field) != 20 and time_module.monotonic() < deadline:
        time_module.sleep(0.01)
        values = counters.read()
    assert values.get(field) == 20 and len(jobs) == 1
    assert time_module.monotonic() - started >= 0.3


def test_counters_go_under_the_key_prefix_they_were_counted_under_even_when_sent_after_it_changed(
        lanes, settings, key_prefix):
    import time as time_module

    from capacity import counters
    from capacity.keys import counters_key
    settings.CAPACITY_COUNTERS_GATHER_SECONDS = 0.2  # sent by the timer, after the prefix below changed
    field = 'served|es2_knn|run'
    counters.increment(('served', 'es2_knn', 'run'))
    settings.CAPACITY_KEY_PREFIX = f'{key_prefix}:later'
    deadline = time_module.monotonic() + 5
    while not lanes.hget(counters_key(key_prefix), field) and time_module.monotonic() < deadline:
        time_module.sleep(0.01)
    assert int(lanes.hget(counters_key(key_prefix), field)) == 1
    assert not lanes.exists(counters_key(f'{key_prefix}:later'))
