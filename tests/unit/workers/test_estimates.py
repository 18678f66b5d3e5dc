"""When a call should start and finish, and the poll hint: pure tables, no database, no Redis."""
import heapq
import itertools

import pytest

from workers.estimates import UNKNOWN, Estimate, poll_after, queued, running


@pytest.mark.parametrize('position, pool, run_s, elapsed, expected', [
    (1, 2, 4.0, (), Estimate(0.0, 4.0)),              # an idle worker takes it now
    (2, 2, 4.0, (), Estimate(0.0, 4.0)),              # the second idle worker
    (3, 2, 4.0, (), Estimate(4.0, 8.0)),              # waits for the first of the two ahead
    (1, 2, 4.0, (1.0, 3.0), Estimate(1.0, 5.0)),      # both busy: the one that has run 3 s frees first
    (2, 2, 4.0, (1.0, 3.0), Estimate(3.0, 7.0)),
    (3, 2, 4.0, (1.0, 3.0), Estimate(5.0, 9.0)),      # after the call that started at 1 s
    (1, 1, 4.0, (9.0,), Estimate(0.0, 4.0)),          # an overdue run may end any moment
    (1, 1, 4.0, (1.0, 2.0), Estimate(2.0, 6.0)),      # more running than the pool (a shrink): the soonest
    (5, 1, 0.03, (), Estimate(0.12, 0.15)),
    (1001, 2, 4.0, (1.0, 3.0), Estimate(2001.0, 2005.0)),  # deep in the queue: 500 rounds of both workers
    (1, 2, 4.0, (-2.0,), Estimate(0.0, 4.0)),         # a start stamped in the future holds at most a run
])
def test_a_queued_call_starts_when_the_calls_ahead_have_left_a_worker(position, pool, run_s, elapsed,
                                                                       expected):
    got = queued(position, pool, run_s, elapsed)
    assert got.start_in == pytest.approx(expected.start_in)
    assert got.finish_in == pytest.approx(expected.finish_in)


def one_by_one(position, pool, run_s, running_elapsed):
    """The calls ahead handed to the first free worker one at a time: what the estimate must equal."""
    free_at = sorted(min(max(run_s - elapsed, 0.0), run_s) for elapsed in running_elapsed)[:pool]
    free_at += [0.0] * (pool - len(free_at))
    heapq.heapify(free_at)
    for _ in range(position - 1):
        heapq.heappush(free_at, heapq.heappop(free_at) + run_s)
    return free_at[0]


@pytest.mark.parametrize('pool, elapsed', [
    (1, ()), (3, ()), (3, (0.5,)), (3, (0.5, 2.9, 1.2)), (2, (0.1, 0.2, 3.5)), (4, (3.0, 3.0, 0.0, 9.0)),
])
def test_the_estimate_is_the_calls_ahead_taking_the_first_free_worker_one_by_one(pool, elapsed):
    for position, run_s in itertools.product(range(1, 40), (0.03, 3.0)):
        assert queued(position, pool, run_s, elapsed).start_in == pytest.approx(
            one_by_one(position, pool, run_s, elapsed)), (position, run_s)


@pytest.mark.parametrize('position, pool, run_s', [
    (1, 2, None),  # nothing measured yet
    (1, 0, 4.0),   # a pool of 0 runs nothing until it is resized
    (None, 2, 4.0),
])
def test_without_a_run_time_or_a_worker_there_is_no_estimate(position, pool, run_s):
    assert queued(position, pool, run_s) == UNKNOWN


def test_a_running_call_finishes_a_run_time_after_it_started_unless_it_is_overdue():
    assert running(1.5, 4.0) == Estimate(None, 2.5)
    assert running(5.0, 4.0) == UNKNOWN  # slower than usual: when it ends is unknown
    assert running(1.0, None) == UNKNOWN


@pytest.mark.parametrize('estimate, expected', [
    (Estimate(0.0, 0.03), 1),    # a 30 ms call: the minimum, not 0
    (Estimate(4.0, 8.0), 8),
    (Estimate(None, 2.0000000001), 2),  # float noise, not a second more
    (Estimate(None, 2.2), 3),    # whole seconds, rounded up
    (Estimate(0.0, 400.0), 30),  # the maximum
    (UNKNOWN, None),
])
def test_the_poll_hint_is_the_time_until_the_expected_finish_within_bounds(estimate, expected):
    assert poll_after(estimate, 1, 30) == expected
