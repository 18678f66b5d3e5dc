"""Sender: every resend of a call carries its Idempotency-Key, and a stop says whether the server may
have taken it."""
import threading

from heavy_lanes_client import RowStatus
from tests.unit.client.fake_api import Drop, Error, Refuse
from tests.unit.client.helpers import ROWS, keys_of, make_run


def test_a_capacity_refusal_is_waited_out_and_resent_with_the_same_idempotency_key(api, client, sleeps):
    api.script.append(Refuse(retry_after=2, scope='es2_knn'))

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    posts = api.posts()
    assert len(posts) == 2 and keys_of(posts)[0] == keys_of(posts)[1]
    capacity_waits = [seconds for seconds in sleeps.asked if seconds >= 1.5]
    assert len(capacity_waits) == 1
    assert 2.0 <= capacity_waits[0] <= 2.4  # Retry-After, plus at most 20 % jitter
    assert report.outcomes[0].status == RowStatus.MATCHED
    s = report.summary
    assert (s.refused_capacity, s.rate_limited, s.server_errors, s.admitted) == (1, 0, 0, 1)


def test_a_503_then_success_reuses_the_same_idempotency_key(api, client, sleeps):
    api.script.append(Error(503, 'queue_unavailable'))

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    posts = api.posts()
    assert [post.answer for post in posts] == [503, 202]
    assert keys_of(posts)[0] == keys_of(posts)[1]
    assert report.summary.server_errors == 1 and report.summary.refused_capacity == 0
    assert report.outcomes[0].status == RowStatus.MATCHED


def test_a_call_the_server_took_before_the_connection_dropped_is_not_run_twice(api, client, sleeps):
    api.script.append(Drop(admit=True))

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    posts = api.posts()
    assert len(posts) == 2 and keys_of(posts)[0] == keys_of(posts)[1]
    assert len(api.tasks) == 1  # the resend got the first task back
    assert report.outcomes[0].task_id == next(iter(api.tasks))
    assert report.summary.connection_errors == 1
    assert report.outcomes[0].status == RowStatus.MATCHED


def test_a_call_stopped_after_a_dropped_connection_is_reported_as_possibly_taken(api, client):
    api.script.append(Drop(admit=True))
    run = None

    def sleep(seconds, stop):  # Ctrl-C arrives while the call backs off before its resend
        threading.Thread(target=run.cancel).start()
        return stop.wait(2)

    run = make_run(client, sleep, rows=ROWS[:1])
    report = run.execute()

    outcome = report.outcomes[0]
    assert len(api.posts()) == 1
    assert outcome.reason == ('run interrupted while resending a call the server may have taken '
                              f'(Idempotency-Key {outcome.idempotency_key})')
