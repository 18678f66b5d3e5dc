"""When an unfinished call should start and finish, from its queue's measured run time: pure, no Django.

A queue's pool runs `pool` calls at once, and its calls run `run_s` seconds on average (measured at every
release: capacity.keys.run_field). A running call is expected to end `run_s` after it started; one that
already ran longer has no estimate (it is slower than usual, and when it ends is unknown). A queued call at
`position` starts when `position` calls have left a worker: the workers free up as their running calls end,
and each call that starts on one holds it `run_s` more. Every worker is free within `run_s`, so the calls
ahead take the workers round by round in the order they free up: the estimate is O(pool), not O(position)
(a 202 at the end of a queue thousands deep is answered as fast as one at its head). The poll hint is the
time until the expected finish, in whole seconds between a minimum and a maximum.
"""
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """Seconds from now until a call is expected to start and to finish; None where unknown."""

    start_in: float | None = None
    finish_in: float | None = None


UNKNOWN = Estimate()


def running(elapsed_s, run_s):
    """The estimate of a call that has run `elapsed_s` seconds, on a queue whose calls run `run_s`."""
    if run_s is None or elapsed_s > run_s:
        return UNKNOWN
    return Estimate(start_in=None, finish_in=run_s - elapsed_s)


def queued(position, pool, run_s, running_elapsed=()):
    """The estimate of the call at `position` (1-based) of a queue with `pool` workers whose calls run
    `run_s` seconds, while calls that have run `running_elapsed` seconds each hold a worker.

    Unknown without a measured run time or a worker (a pool of 0 runs nothing until it is resized).
    """
    if run_s is None or pool < 1 or position is None or position < 1:
        return UNKNOWN
    # When each worker is next free: a running call's expected rest (0 when it is overdue; never more than a
    # whole run), else now. The soonest `pool` of them: more run than the pool after a shrink.
    free_at = sorted(min(max(run_s - elapsed, 0.0), run_s) for elapsed in running_elapsed)[:pool]
    free_at = [0.0] * (pool - len(free_at)) + free_at
    # Each free time is within one run of now, so a worker freed again (a run later) is free after every
    # other worker's present free time: the calls ahead take the workers in rounds, in this order.
    rounds, turn = divmod(position - 1, pool)
    start_in = free_at[turn] + rounds * run_s
    return Estimate(start_in=start_in, finish_in=start_in + run_s)


def poll_after(estimate, minimum, maximum):
    """Whole seconds to wait before polling again: until the expected finish, within [minimum, maximum];
    None when there is no estimate."""
    if estimate.finish_in is None:
        return None
    return max(minimum, min(maximum, math.ceil(estimate.finish_in - 1e-9)))
