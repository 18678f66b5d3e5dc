"""A run's progress is written in batches: each tenth of its rows or each second, whichever comes first; never
one write a row, and never all rows done (the run's end is recorded right after)."""
from types import SimpleNamespace

import pytest

from workers.progress import RowProgress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def written(reports, total=1000):
    """The rows_done values written for `reports`: (rows_done, seconds since the run began) in order."""
    clock, writes = Clock(), []
    progress = RowProgress(SimpleNamespace(pk='w1'), write=lambda work, done: writes.append(done), clock=clock)
    start = clock.now
    for done, at in reports:
        clock.now = start + at
        progress(done, total)
    return writes


@pytest.mark.parametrize('reports, writes', [
    # one row at a time, fast: a write each tenth, none per row
    ([(n, n / 10_000) for n in range(1, 1001)], [100 * k for k in range(1, 10)]),
    # slow rows: a write each second even before a tenth is done
    ([(10, 0.5), (20, 1.0), (30, 1.5), (40, 2.1)], [20, 40]),
    # all rows done is left to the run's end; a call of one slice writes nothing
    ([(5, 0.1), (1000, 0.2)], []),
    ([(1000, 0.1)], []),
    # nothing new, nothing written; going back (a stale report) writes nothing
    ([(100, 0.1), (100, 2.0), (50, 3.0)], [100]),
])
def test_progress_is_written_each_tenth_or_each_second(reports, writes):
    assert written(reports) == writes


def test_a_small_call_writes_each_row_at_most_but_the_last():
    assert written([(1, 0.0), (2, 0.0), (3, 0.0)], total=3) == [1, 2]


def test_a_write_the_database_refuses_is_skipped_and_the_next_catches_up():
    from django.db import OperationalError
    clock, writes = Clock(), []

    def write(work, done):
        if not writes:
            writes.append(None)
            raise OperationalError('the server closed the connection')
        writes.append(done)
    progress = RowProgress(SimpleNamespace(pk='w1'), write=write, clock=clock)
    progress(100, 1000)
    progress(150, 1000)  # the failed write left 0 written: another tenth is done since
    assert writes == [None, 150]
