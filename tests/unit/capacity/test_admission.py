"""An Admission as a value (capacity.admission): its JSON form, its leases, and the headers, 429 body and
log record rendered from it, as tables. No database, no Redis."""
import pytest

from capacity.admission import Admission, LaneState, headers, lease_from_message, log_record, refusal_body
from capacity.caller import RequestFacts
from capacity.constants import Decision, Lane
from capacity.decisions import Call

A, T, K, R, U = Lane.API_HEAVY, Lane.API_HEAVY_TASK, Lane.ES2_KNN, Lane.TIER, Lane.USER
CALL = Call(endpoint='$match', rows=25, tier='preview', user_id=7, semantic=True, waits=True, host='h1',
            queue='es2_knn', draws_on=K)


def lanes(a=1, t=1, k=1, r=1, u=1, limits=(3, 1, 2, 2, 1)):
    counts = (a, t, k, r, u)
    names = (A, T, K, R, U)
    keys = ('{p}:api_heavy', '{p}:api_heavy_task:h1', '{p}:es2_knn', '{p}:tier:preview', '{p}:user:7')
    return tuple(LaneState(lane, key, limit, count) for lane, key, limit, count in zip(names, keys, limits, counts))


def admission(decision=Decision.ADMITTED, **fields):
    values = dict(decision=decision, token='t' * 32, call=CALL, mode='shadow', lanes=lanes(), holding=True,
                  lease_ms=600_000, suggested=1)
    values.update(fields)
    return Admission(**values)


ADMITTED = admission()
SHADOW_REFUSED = admission(Decision.SHADOW_REFUSED, lanes=lanes(u=2), full=(U,), retry_after=5)
REFUSED = admission(Decision.REFUSED, lanes=lanes(u=1), full=(U,), holding=False, retry_after=5, enforced=True,
                    mode='enforce')
PAUSED = admission(Decision.REFUSED, lanes=lanes(limits=(3, 1, 2, 0, 1)), full=(A, R), holding=False,
                   retry_after=120, suggested=0)
SKIPPED = admission(Decision.UNAVAILABLE, lanes=tuple(LaneState(s.lane, s.key, s.limit) for s in lanes()),
                    holding=False, error='skipped: Redis failed recently')
OFF = Admission(decision=None, token='t' * 32, mode='off')


@pytest.mark.parametrize('value', [ADMITTED, SHADOW_REFUSED, REFUSED, PAUSED, SKIPPED, OFF,
                                   admission(facts=RequestFacts(aware=True, queue_ms=3000, cid='req-1'))])
def test_the_json_form_reads_back_as_the_same_value(value):
    assert Admission.from_json(value.to_json()) == value


def test_a_row_the_limiter_never_saw_reads_as_off():
    value = Admission.from_json({}, token='abc')
    assert value.decision is None and value.token == 'abc' and headers(value) == {} and log_record(value) is None


@pytest.mark.parametrize('value, expected', [
    (ADMITTED, {'X-OCL-Capacity-Decision': 'admitted', 'X-OCL-Capacity-Limit': '3',
                'X-OCL-Capacity-In-Flight': '1', 'X-OCL-Capacity-Tier': 'preview', 'X-OCL-Capacity-Tier-Limit': '2',
                'X-OCL-Capacity-Tier-In-Flight': '1', 'X-OCL-Capacity-Suggested-Concurrency': '1'}),
    # refused: Retry-After too, never for shadow-refused
    (REFUSED, {'X-OCL-Capacity-Decision': 'refused', 'X-OCL-Capacity-Limit': '3', 'X-OCL-Capacity-In-Flight': '1',
               'X-OCL-Capacity-Tier': 'preview', 'X-OCL-Capacity-Tier-Limit': '2',
               'X-OCL-Capacity-Tier-In-Flight': '1', 'X-OCL-Capacity-Suggested-Concurrency': '1',
               'Retry-After': '5'}),
    # Redis skipped: limits and the suggestion, no counts
    (SKIPPED, {'X-OCL-Capacity-Decision': 'unavailable', 'X-OCL-Capacity-Limit': '3',
               'X-OCL-Capacity-Tier': 'preview', 'X-OCL-Capacity-Tier-Limit': '2',
               'X-OCL-Capacity-Suggested-Concurrency': '1'}),
    # served by shared work: no lane of its own, but the suggestion a client sizes its run by
    (admission(Decision.COALESCED, lanes=(), holding=False, suggested=2),
     {'X-OCL-Capacity-Decision': 'coalesced', 'X-OCL-Capacity-Suggested-Concurrency': '2'}),
    (admission(Decision.CACHED, lanes=(), holding=False, suggested=0),
     {'X-OCL-Capacity-Decision': 'cached', 'X-OCL-Capacity-Suggested-Concurrency': '0'}),
    (admission(Decision.CACHED, lanes=(), holding=False, suggested=None), {'X-OCL-Capacity-Decision': 'cached'}),
    (OFF, {}),
    (None, {}),
])
def test_headers(value, expected):
    assert headers(value) == expected


def test_shadow_refused_has_no_retry_after_header():
    assert 'Retry-After' not in headers(SHADOW_REFUSED)


@pytest.mark.parametrize('value, body', [
    (REFUSED, {'detail': 'Matching is busy. Please retry in 5 seconds.', 'error_code': 'capacity_exceeded',
               'scope': 'user', 'paused': False, 'retry_after': 5}),
    # a paused lane is the scope, and says so
    (PAUSED, {'detail': 'Matching is busy. Please retry in 120 seconds.', 'error_code': 'capacity_exceeded',
              'scope': 'tier', 'paused': True, 'retry_after': 120}),
])
def test_the_refusal_body(value, body):
    assert refusal_body(value) == body


def test_the_log_record():
    facts = RequestFacts(queue_ms=3000, request_source='automatch', algorithm_id='a' * 100,
                         automatch_run_id='r' * 20, cid='req-1')
    record = log_record(admission(Decision.SHADOW_REFUSED, lanes=lanes(u=2), full=(U,), retry_after=5,
                                  facts=facts))
    assert record == {
        'event': 'ocl_capacity', 'decision': 'shadow-refused', 'mode': 'shadow', 'enforced': False,
        'endpoint': '$match', 'semantic': True, 'reranker': False, 'rows': 25, 'single_row': False,
        'waits': True, 'tier': 'preview', 'user_id': 7, 'scope': 'user', 'full': ['user'],
        'in_flight': 1, 'limit': 3, 'task_in_flight': 1, 'task_limit': 1, 'es2_knn_in_flight': 1,
        'es2_knn_limit': 2, 'tier_in_flight': 1, 'tier_limit': 2, 'user_in_flight': 2, 'user_limit': 1,
        'suggested': 1, 'retry_after': 5, 'queue_ms': 3000, 'error': None, 'host': 'h1',
        'request_source': 'automatch', 'algorithm_id': 'a' * 100, 'automatch_run_id': 'r' * 20, 'cid': 'req-1',
        'request_id': 'req-1', 'task_id': 't' * 32}


def test_the_worker_gets_every_lane_but_this_hosts():
    lease = ADMITTED.worker_lease(60_000, store=object())
    assert lease.keys == ['{p}:api_heavy', '{p}:es2_knn', '{p}:tier:preview', '{p}:user:7']
    assert lease.token == 't' * 32 and lease.lease_ms == 60_000 and lease.holding
    assert ADMITTED.worker_limits() == [3, 2, 2, 1]
    assert ADMITTED.host_key == '{p}:api_heavy_task:h1'
    assert ADMITTED.lease(store=object()).keys == [state.key for state in lanes()]


@pytest.mark.parametrize('value, within_limit', [
    (ADMITTED, True),
    (SHADOW_REFUSED, False),  # let past a full lane: its release measures the run, not the holds
])
def test_whether_a_call_was_within_the_limit_reaches_every_release_of_its_leases(value, within_limit):
    message = value.worker_lease_message()
    assert message['within_limit'] is within_limit
    assert lease_from_message(message, 60_000, store=object()).within_limit is within_limit
    assert value.worker_lease(60_000, store=object()).within_limit is within_limit
    assert value.lease(store=object()).within_limit is within_limit


def test_a_message_from_before_within_limit_was_carried_measures_as_it_did():
    message = {key: value for key, value in ADMITTED.worker_lease_message().items() if key != 'within_limit'}
    assert lease_from_message(message, 60_000, store=object()).within_limit is True
