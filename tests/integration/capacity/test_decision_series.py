"""Decisions per minute over the last hour (capacity.counters), kept in Redis beside the cumulative counters:
one small hash a minute that expires an hour after its minute. On fakeredis and the real Redis."""
import itertools
import time
from collections import Counter

import pytest

from capacity import counters
from capacity.keys import decisions_minute_key

pytestmark = pytest.mark.django_db


def wait_for(read, timeout=5):
    """Poll `read()` until it returns something true (the counters reach Redis a moment after the
    increment, on the Redis thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = read()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f'nothing after {timeout} s')


def test_a_call_counts_in_the_minute_it_was_decided_and_the_series_covers_the_last_hour(
        lanes, gates, make_user):
    user = make_user('core_user')
    admissions = [gates(user, rows=10) for _ in range(3)]  # es2_knn's bulk limit is 2: the third finds it full
    before = time.time()
    for admission in admissions:
        counters.record_decision(admission, 'es2_knn')
    after = time.time()

    def counted():
        series = counters.decisions_per_minute(now=after)
        total = sum((Counter(minute['decisions']) for minute in series), Counter())
        return series if total == {'admitted': 2, 'shadow-refused': 1} else None
    series = wait_for(counted)
    assert len(series) == counters.SERIES_MINUTES == 60
    assert series[-1]['minute'] == int(after // 60) * 60
    assert [later['minute'] - earlier['minute'] for earlier, later in itertools.pairwise(series)] == [60] * 59
    # In the minute they were decided (two, when a minute ended meanwhile), and in no other.
    assert {minute['minute'] for minute in series if minute['decisions']} <= {
        int(before // 60) * 60, int(after // 60) * 60}
    # The cumulative counters are kept as before, and the minutes are not among them.
    assert counters.read()[('decision', 'es2_knn', 'core', 'admitted')] == 2
    assert set(counters.read()) == {('decision', 'es2_knn', 'core', 'admitted'),
                                    ('decision', 'es2_knn', 'core', 'shadow-refused'),
                                    ('full', 'es2_knn', 'core', 'shadow-refused')}


def test_a_minute_is_kept_for_an_hour_after_it_and_no_longer(lanes):
    current = int(time.time() // 60)
    counters.increment(minutes=[(current - 59, 'refused'), (current - 61, 'refused'), (current - 59, 'refused')])
    wait_for(lambda: lanes.exists(decisions_minute_key(current - 59)))
    # It goes when it leaves the window: at the end of the hour after its minute.
    leaves = (current - 59 + counters.SERIES_MINUTES + 1) * 60
    assert abs(lanes.ttl(decisions_minute_key(current - 59)) - (leaves - time.time())) <= 2
    assert not lanes.exists(decisions_minute_key(current - 61))  # an hour old already: gone at once
    series = counters.decisions_per_minute(now=current * 60)
    assert series[0] == {'minute': (current - 59) * 60, 'decisions': {'refused': 2}}


@pytest.mark.parametrize(('asked', 'length'), [
    (5, 5),      # the last five minutes
    (0, 1),      # at least this minute
    (500, 60),   # at most the hour that is kept
])
def test_the_series_reaches_back_at_most_an_hour(lanes, asked, length):
    series = counters.decisions_per_minute(asked, now=600_000.0)
    assert [minute['minute'] for minute in series] == [600_000 - 60 * i for i in reversed(range(length))]
