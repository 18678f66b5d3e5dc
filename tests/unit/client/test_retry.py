"""Retry: a call gives up within its bounds, and one call's Retry-After holds back the others."""
import re

from heavy_lanes_client import RetryPolicy, RowStatus
from tests.unit.client.fake_api import Refuse
from tests.unit.client.helpers import ROWS, keys_of, make_run


def test_a_refusal_that_never_ends_gives_up_after_max_attempts_with_one_key(api, client, sleeps):
    api.default = Refuse(retry_after=1)

    report = make_run(client, sleeps, rows=ROWS[:1], retry=RetryPolicy(max_attempts=3)).execute()

    posts = api.posts()
    assert len(posts) == 3 and len(set(keys_of(posts))) == 1
    outcome = report.outcomes[0]
    assert outcome.status == RowStatus.FAILED
    assert outcome.reason.startswith('gave up after 3 attempts')
    assert 'capacity refused (lane es2_knn full' in outcome.reason
    assert report.summary.refused_capacity == 3


def test_a_wait_longer_than_the_total_bound_is_not_waited(api, client, sleeps):
    api.default = Refuse(retry_after=120, scope='es2_knn', paused=True)

    retry = RetryPolicy(max_wait_seconds=60, wait_paused=True)
    report = make_run(client, sleeps, rows=ROWS[:1], retry=retry).execute()

    assert len(api.posts()) == 1
    assert not [seconds for seconds in sleeps.asked if seconds >= 60]
    expected = (r'gave up after 1 attempt \(0 s waiting; 1[2-4]\d s more would pass the 60 s limit\): '
                r'capacity refused \(lane es2_knn paused, Retry-After 120 s\)')
    assert re.fullmatch(expected, report.outcomes[0].reason)


def test_a_paused_lane_stops_the_run_at_once_and_says_why(api, client, sleeps):
    api.default = Refuse(retry_after=120, scope='es2_knn', paused=True)

    report = make_run(client, sleeps, rows=['a', 'b', 'c'], batch_size=1).execute()

    assert len(api.posts()) == 1  # no wait, no resend, and the other batches are not sent
    assert not [seconds for seconds in sleeps.asked if seconds >= 1]
    first, *others = report.outcomes
    assert first.reason.startswith('stopped: lane es2_knn is paused on the server (its limit is 0), and '
                                   'waiting will not clear it')
    assert '--wait-paused' in first.reason
    assert all(outcome.reason.startswith('not submitted: an earlier call was stopped: lane es2_knn is paused')
               for outcome in others)
    assert report.summary.refused_capacity == 1


def test_asked_to_wait_a_pause_out_it_waits_the_paused_retry_after(api, client, sleeps):
    api.script.append(Refuse(retry_after=120, scope='es2_knn', paused=True))

    report = make_run(client, sleeps, rows=ROWS[:1], retry=RetryPolicy(wait_paused=True)).execute()

    assert report.ok and len(api.posts()) == 2
    assert [seconds for seconds in sleeps.asked if seconds >= 120]


def test_the_retry_after_of_one_call_holds_back_the_others(api, client, sleeps):
    api.suggested = 2
    api.script.extend([Refuse(retry_after=5, suggested=2)])

    make_run(client, sleeps, rows=['a', 'b', 'c'], batch_size=1).execute()

    # The first answer was the refusal (with suggestion 2); every later send waited for its Retry-After.
    assert sum(1 for seconds in sleeps.asked if seconds >= 4.0) >= 2
