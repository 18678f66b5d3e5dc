"""The cluster run's lane check (cluster/checks.py) on rows made here: a work taken over from a dead node is
counted over every one of its lanes, so each lane may be one over per such work in it — and no more."""
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from cluster import checks

T0 = datetime(2026, 12, 4, tzinfo=UTC)
LANES = {'api_heavy': 3, 'es2_knn': 2}


def call(number, start, end, attempts=1, lanes=('api_heavy', 'es2_knn')):
    """A call admitted into `lanes`, open from `start` to `end` seconds after T0, run `attempts` times."""
    work = SimpleNamespace(finished_at=T0 + timedelta(seconds=end), worker='lane@worker1', attempts=attempts)
    admission = {'decision': 'admitted', 'holding': True,
                 'lanes': [(lane, f'{{hl}}:lane:{lane}', LANES[lane], 0) for lane in lanes]}
    return SimpleNamespace(pk=number, work_id=f'w{number}', work=work, created_at=T0 + timedelta(seconds=start),
                           admission=admission)


def rows(*calls):
    return {c.pk: c for c in calls}


def test_two_works_taken_over_put_each_of_their_lanes_up_to_two_over():
    # es2_knn (limit 2) holds 4 at once, api_heavy (limit 3) 4: both within two works taken over
    calls = rows(call(1, 0, 60, attempts=2), call(2, 0, 60, attempts=2), call(3, 20, 40), call(4, 21, 40))
    check = checks.lanes_within_limits(calls, fail_open=False)
    assert check.passed, check.detail
    assert 'es2_knn 4 of 2' in check.detail and 'api_heavy 4 of 3' in check.detail


def test_a_lane_further_over_than_its_works_taken_over_fails():
    # one work taken over, yet es2_knn holds 4 of 2
    calls = rows(call(1, 0, 60, attempts=2), call(2, 0, 60), call(3, 20, 40), call(4, 21, 40))
    check = checks.lanes_within_limits(calls, fail_open=False)
    assert not check.passed
    assert 'es2_knn 4 of 2' in check.detail


def test_a_work_taken_over_excuses_only_the_lanes_it_is_in():
    # the work taken over is in api_heavy alone; es2_knn is one over with nothing to excuse it
    calls = rows(call(1, 0, 60, attempts=2, lanes=('api_heavy',)), call(2, 0, 60), call(3, 20, 40),
                 call(4, 21, 40))
    check = checks.lanes_within_limits(calls, fail_open=False)
    assert not check.passed
    assert 'es2_knn 3 of 2' in check.detail and 'api_heavy 4 of 3' in check.detail


def test_within_limits_passes_and_a_redis_failover_excuses_anything():
    assert checks.lanes_within_limits(rows(call(1, 0, 60), call(2, 10, 30)), fail_open=False).detail == 'none over'
    over = rows(call(1, 0, 60), call(2, 0, 60), call(3, 20, 40), call(4, 21, 40))
    assert not checks.lanes_within_limits(over, fail_open=False).passed
    assert checks.lanes_within_limits(over, fail_open=True).passed
