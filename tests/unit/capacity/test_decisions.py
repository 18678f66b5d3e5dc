"""The limiter's policy as tables (capacity.decisions): no database, no Redis.

Lane selection and limits, the decision, Retry-After, the scope a refusal names, suggested concurrency and
the waiting room, each row one case with the reason it is there.
"""
import pytest

from capacity.constants import Decision, Lane
from capacity.decisions import (
    Call, LaneLimit, bulk_limit, decide, holds_measured, is_enforced, is_single_row, lanes_for, refusal_body,
    retry_after, scope, suggested_concurrency,
)
from tests.unit.defaults import config

A, T, K, R, U = Lane.API_HEAVY, Lane.API_HEAVY_TASK, Lane.ES2_KNN, Lane.TIER, Lane.USER


def call(endpoint='$match', rows=10, tier='preview', **fields):
    return Call(endpoint=endpoint, rows=rows, tier=tier, user_id=7, host='h1', **fields)


@pytest.mark.parametrize('endpoint, rows, single', [
    ('$match', 1, True),     # a person waiting on one row
    ('$match', 2, False),    # bulk
    ('$match', 0, False),    # no rows is not a single row
    ('$rerank', 1, False),   # $rerank comes from bulk auto-match runs, never interactive
])
def test_single_row(endpoint, rows, single):
    assert is_single_row(endpoint, rows) is single


@pytest.mark.parametrize('the_call, expected', [
    # a bulk semantic call by a preview user: the bulk share of api_heavy and es2_knn (4-1, 3-1)
    (call(semantic=True), [(A, (), 3), (K, (), 2), (R, ('preview',), 2), (U, (7,), 1)]),
    # a single-row call may use the reserve in every reserved lane it takes
    (call(rows=1, semantic=True), [(A, (), 4), (K, (), 3), (R, ('preview',), 2), (U, (7,), 1)]),
    # reranked lexical: no es2_knn lane
    (call(reranker=True), [(A, (), 3), (R, ('preview',), 2), (U, (7,), 1)]),
    # a call whose request waits takes no host lane itself: the waiting takes a slot of its own (below)
    (call(waits=True, tier='core'), [(A, (), 3), (R, ('core',), 4), (U, (7,), 3)]),
    # a waiting request (a waiting POST, a long poll) for a bulk call: this host's lane, its bulk share
    (call(wait_slot=True), [(T, ('h1',), 63)]),
    # ... for a single-row call: the whole lane (the reserve keeps a host full of bulk waits open to it)
    (call(rows=1, wait_slot=True), [(T, ('h1',), 64)]),
    # ... for nothing known (no endpoint, no rows): bulk
    (call(endpoint='', rows=0, wait_slot=True), [(T, ('h1',), 63)]),
])
def test_lanes_and_limits(the_call, expected):
    assert [(item.lane, item.parts, item.limit) for item in lanes_for(config(), the_call)] == expected


@pytest.mark.parametrize('limit, reserve, bulk', [
    (4, 1, 3),
    (1, 1, 0),   # the whole lane is the reserve: bulk calls get none
    (0, 1, 0),   # never below 0
])
def test_bulk_limit(limit, reserve, bulk):
    assert bulk_limit(limit, config(reserve_single_row=reserve)) == bulk


@pytest.mark.parametrize('room, queue, draws_on, enforced, es2_knn_limit', [
    (2, 'es2_knn', K, True, 4),     # enforce: two may wait beyond the bulk limit of 2
    (2, 'es2_knn', K, False, 2),    # shadow counts against the plain limit
    (0, 'es2_knn', K, True, 2),     # no waiting room configured
    (2, 'es2_knn', None, True, 2),  # a call with no queue lane has no waiting room
])
def test_the_waiting_room(room, queue, draws_on, enforced, es2_knn_limit):
    conf = config(queue={'max_waiting': {'interactive': 0, 'es2_knn': room, 'api_heavy': 0}})
    lanes = lanes_for(conf, call(semantic=True, queue=queue, draws_on=draws_on), enforced=enforced)
    assert {item.lane: item.limit for item in lanes}[K] == es2_knn_limit


def test_a_paused_lane_gets_no_waiting_room():
    conf = config(es2_knn=1, queue={'max_waiting': {'interactive': 0, 'es2_knn': 5, 'api_heavy': 0}})
    lanes = lanes_for(conf, call(semantic=True, queue='es2_knn', draws_on=K), enforced=True)
    assert {item.lane: item.limit for item in lanes}[K] == 0


LANES = [LaneLimit(A, (), 3), LaneLimit(R, ('core',), 4), LaneLimit(U, (7,), 2)]


@pytest.mark.parametrize('before, taken, decision, full', [
    ((0, 0, 0), True, Decision.ADMITTED, ()),
    ((3, 1, 1), True, Decision.SHADOW_REFUSED, (A,)),   # forced (shadow): counted although full
    ((3, 1, 2), False, Decision.REFUSED, (A, U)),       # enforced: nothing taken
    ((2, 3, 1), True, Decision.ADMITTED, ()),           # one under every limit
])
def test_decide(before, taken, decision, full):
    assert decide(LANES, before, taken) == (decision, full)


@pytest.mark.parametrize('decision, measured', [
    (Decision.ADMITTED, True),         # held its slots within every limit: what a refused caller waits for
    (Decision.SHADOW_REFUSED, False),  # let past a full lane: its hold is mostly a wait behind the others over
                                       # the limit (a shadow burst measured 32 s holds of a 375 ms run)
    (Decision.UNAVAILABLE, False),     # not counted, or not known to be within the limit
    (Decision.REFUSED, False),         # holds nothing
    (Decision.COALESCED, False),       # no lease of its own
    (Decision.CACHED, False),
    (None, False),                     # the limiter was off
])
def test_only_calls_admitted_within_the_limit_feed_the_measured_holds(decision, measured):
    assert holds_measured(decision) is measured


@pytest.mark.parametrize('before, full, changes, seconds', [
    ((3, 0, 0), (A,), {}, 5),                          # one call ahead: base
    ((5, 0, 0), (A,), {}, 15),                         # three ahead
    ((3, 0, 4), (A, U), {}, 15),                       # the fullest lane decides
    ((20, 0, 0), (A,), {}, 30),                        # capped by max
    ((20, 0, 0), (A,), {'retry_after': {'max': 12}}, 12),
])
def test_retry_after_per_call_ahead(before, full, changes, seconds):
    assert retry_after(config(**changes), LANES, before, full) == seconds


@pytest.mark.parametrize('before, full, holds, changes, seconds', [
    ((3, 0, 0), (A,), (2000, None, None), {}, 1),       # 3 leases of 2 s: one frees every 0.67 s -> 1 s
    ((3, 0, 0), (A,), (6000, None, None), {}, 2),       # 6 s / 3 = 2 s exactly, not 3
    ((5, 0, 0), (A,), (2000, None, None), {}, 2),       # 3 ahead of 5 leases of 2 s: 1.2 s -> 2 s
    ((3, 0, 2), (A, U), (2000, None, 4000), {}, 2),     # both full: the user's own lane frees last
    ((3, 0, 2), (A, U), (2000, None, None), {}, 5),     # one full lane unmeasured: the seed's 5 s for it
    ((3, 0, 0), (A,), (30, None, None), {}, 1),         # never under min
    ((3, 0, 0), (A,), (30, None, None), {'retry_after': {'min': 3}}, 3),
    ((3, 0, 0), (A,), (900_000, None, None), {}, 30),   # never over max
    ((3, 0, 0), (A,), (6000, None, None), {'retry_after': {'measured': 0}}, 5),  # turned off: the seed's
    ((3, 0, 0), (A,), (), {}, 5),                       # nothing read (a lane had room): the seed's
])
def test_retry_after_from_measured_holds(before, full, holds, changes, seconds):
    assert retry_after(config(**changes), LANES, before, full, holds) == seconds


def test_a_paused_lane_keeps_the_paused_value_whatever_was_measured():
    lanes = [LaneLimit(A, (), 3), LaneLimit(R, ('preview',), 0)]
    assert retry_after(config(), lanes, (3, 0), (A, R), (2000, 2000)) == 120


def test_retry_after_of_a_paused_lane_is_the_paused_value():
    lanes = [LaneLimit(A, (), 3), LaneLimit(R, ('preview',), 0)]
    assert retry_after(config(), lanes, (3, 0), (A, R)) == 120


@pytest.mark.parametrize('limits, full, expected', [
    ({A: 3, R: 0}, (A, R), R),   # a paused lane first: it decides the long wait
    ({A: 3, U: 1}, (A, U), A),   # else the first full one
    ({A: 3}, (), None),
])
def test_scope(limits, full, expected):
    assert scope(limits, full) == expected


@pytest.mark.parametrize('limits, counts, expected', [
    ({}, {}, None),                                    # no lanes
    ({A: 3, K: 2, R: 4, U: 3}, {}, 3),                 # nothing counted: the per-user limit
    ({A: 3, K: 0, R: 4, U: 3}, {A: 1}, 0),             # a paused lane
    ({A: 3, K: 2, R: 4, U: 3}, {A: 1, K: 1, R: 1, U: 1}, 2),  # own call + one slot left in es2_knn
    ({A: 3, R: 2, U: 1}, {A: 3, R: 2, U: 1}, 1),       # at the cap: never below 1
    ({A: 3, T: 1, R: 4, U: 3}, {A: 1, T: 1, R: 1, U: 1}, 3),  # the host's lane is left out
])
def test_suggested_concurrency(limits, counts, expected):
    assert suggested_concurrency(limits, counts) == expected


@pytest.mark.parametrize('mode, enforce_for, aware, enforced', [
    ('shadow', 'all', True, False),
    ('off', 'all', True, False),
    ('enforce', 'all', False, True),
    ('enforce', 'aware', False, False),
    ('enforce', 'aware', True, True),
])
def test_is_enforced(mode, enforce_for, aware, enforced):
    assert is_enforced(config(mode=mode, enforce_for=enforce_for), aware) is enforced


def test_the_refusal_body():
    assert refusal_body(120, R, True) == {
        'detail': 'Matching is busy. Please retry in 120 seconds.', 'error_code': 'capacity_exceeded',
        'scope': 'tier', 'paused': True, 'retry_after': 120}
