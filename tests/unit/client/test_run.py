"""Run: batches, retries with the same key, concurrency from the server, outcomes per row, cancel."""
import re
import threading

from heavy_lanes_client import PollPolicy, RetryPolicy, RowStatus, Run
from tests.unit.client.fake_api import Drop, Error, Invalid, RateLimit, Refuse

SOURCE = '/orgs/HPO/sources/HPO/'
ROWS = ['chest pain', 'short of breath', 'pounding headache', 'dizzy when standing up', 'itchy rash']


def make_run(client, sleeps, rows=ROWS, **options):
    options.setdefault('batch_size', 2)
    options.setdefault('max_concurrency', 4)
    return Run.match(client, rows, SOURCE, semantic=True, sleep=sleeps, **options)


def keys_of(posts):
    return [post.headers['idempotency-key'] for post in posts]


def test_batches_cover_every_row_once_in_input_order(api, client, sleeps):
    report = make_run(client, sleeps).execute()

    sent = {tuple(row['name'] for row in post.body['rows']) for post in api.posts()}
    assert sent == {('chest pain', 'short of breath'), ('pounding headache', 'dizzy when standing up'),
                    ('itchy rash',)}
    assert [outcome.name for outcome in report.outcomes] == ROWS
    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED] * 5
    assert report.outcomes[0].top['matched'] == 'chest pain'
    assert report.ok and report.summary.admitted == 3 and report.summary.submissions == 3


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


def test_a_rate_limit_is_counted_apart_from_a_capacity_refusal(api, client, sleeps):
    api.script.append(RateLimit(retry_after=1))

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    s = report.summary
    assert (s.refused_capacity, s.rate_limited, s.server_errors) == (0, 1, 0)
    assert report.outcomes[0].status == RowStatus.MATCHED
    assert len(set(keys_of(api.posts()))) == 1


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


def test_a_failed_task_makes_its_rows_failed_never_no_match(api, client, sleeps):
    api.final_states.extend(['failed'])

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.FAILED, RowStatus.FAILED]
    assert report.outcomes[0].reason == 'task failed: The worker failed: scripted failure.'
    assert report.outcomes[0].task_id in api.tasks
    assert report.summary.no_match == 0 and report.summary.tasks_failed == 1 and not report.ok


def test_an_expired_task_makes_its_rows_failed(api, client, sleeps):
    api.final_states.extend(['expired'])

    report = make_run(client, sleeps, rows=ROWS[:1]).execute()

    assert report.outcomes[0].status == RowStatus.FAILED
    assert report.outcomes[0].reason.startswith('task expired')
    assert report.summary.tasks_expired == 1


def test_no_match_only_for_a_row_the_server_ran_and_found_nothing_for(api, client, sleeps):
    api.no_match = {'short of breath'}

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.NO_MATCH]
    assert report.outcomes[1].reason is None and report.ok


def test_a_row_missing_from_a_succeeded_result_is_failed_not_no_match(api, client, sleeps):
    api.short_results = True

    report = make_run(client, sleeps, rows=ROWS[:2], batch_size=2).execute()

    assert [outcome.status for outcome in report.outcomes] == [RowStatus.MATCHED, RowStatus.FAILED]
    assert report.outcomes[1].reason == 'the task result has no entry for this row'


def test_never_more_calls_in_flight_than_the_suggested_concurrency(api, client, sleeps):
    api.suggested = 2
    api.task_seconds = 0.08

    report = make_run(client, sleeps, rows=[f'row {i}' for i in range(10)], batch_size=1,
                      max_concurrency=8).execute()

    assert api.max_open == 2  # the server's suggestion, and used in full
    assert max(post.open_before for post in api.posts()) == 1
    assert report.summary.max_in_flight == 2 and report.ok


def test_a_lower_suggestion_is_followed_once_the_calls_in_flight_have_ended(api, client, sleeps):
    answers = iter([3])
    api.suggested = lambda fake, token: next(answers, 1)  # 3 on the first answer, then 1
    api.task_seconds = 0.05

    report = make_run(client, sleeps, rows=[f'row {i}' for i in range(8)], batch_size=1).execute()

    posts = api.posts()
    assert posts[0].open_before == 0
    assert max(post.open_before for post in posts[:3]) <= 2  # up to 3 in flight while 3 was allowed
    assert [post.open_before for post in posts[3:]] == [0] * 5  # then one at a time
    assert report.summary.max_in_flight <= 3 and report.ok


def test_without_capacity_headers_the_run_uses_its_own_cap(api, client, sleeps):
    api.suggested = None  # the limiter is off: no X-OCL-Capacity-* headers
    api.task_seconds = 0.1

    make_run(client, sleeps, rows=[f'row {i}' for i in range(8)], batch_size=1, max_concurrency=3).execute()

    assert api.max_open == 3


def test_a_bad_source_stops_the_run_after_the_first_call(api, client, sleeps):
    api.script.append(Invalid({'target_repo_url': ["Unknown source '/orgs/X/sources/X/'."]}))

    report = make_run(client, sleeps).execute()

    assert len(api.posts()) == 1
    assert [outcome.status for outcome in report.outcomes] == [RowStatus.FAILED] * 5
    assert 'target_repo_url' in report.outcomes[0].reason
    assert report.outcomes[4].reason.startswith('not submitted: an earlier call was rejected')
    assert report.summary.rejected == 1


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

    report = make_run(client, sleeps, rows=ROWS[:1], retry=RetryPolicy(max_wait_seconds=60)).execute()

    assert len(api.posts()) == 1
    assert not [seconds for seconds in sleeps.asked if seconds >= 60]
    expected = (r'gave up after 1 attempt \(0 s waiting; 1[2-4]\d s more would pass the 60 s limit\): '
                r'capacity refused \(lane es2_knn paused, Retry-After 120 s\)')
    assert re.fullmatch(expected, report.outcomes[0].reason)


def test_the_retry_after_of_one_call_holds_back_the_others(api, client, sleeps):
    api.suggested = 2
    api.script.extend([Refuse(retry_after=5, suggested=2)])

    make_run(client, sleeps, rows=['a', 'b', 'c'], batch_size=1).execute()

    # The first answer was the refusal (with suggestion 2); every later send waited for its Retry-After.
    assert sum(1 for seconds in sleeps.asked if seconds >= 4.0) >= 2


def test_cancel_deletes_every_task_in_flight_and_sends_nothing_more(api, client, sleeps):
    api.suggested = 3
    api.hold_tasks = True
    run = make_run(client, sleeps, rows=[f'row {i}' for i in range(5)], batch_size=1)
    result = {}
    thread = threading.Thread(target=lambda: result.update(report=run.execute()))
    thread.start()
    assert api.wait_for(lambda fake: len(fake.tasks) == 3)

    run.cancel()
    thread.join(5)

    report = result['report']
    deleted = sorted(seen.path.split('/')[2] for seen in api.requests('DELETE'))
    assert deleted == sorted(api.tasks)
    assert len(api.posts()) == 3
    statuses = [(outcome.status, outcome.reason) for outcome in report.outcomes]
    assert statuses[:3] == [(RowStatus.FAILED, 'cancelled: run interrupted')] * 3
    assert statuses[3:] == [(RowStatus.FAILED, 'not submitted: run interrupted')] * 2
    assert report.summary.interrupted and report.summary.tasks_cancelled == 3


def test_a_task_that_outlives_its_timeout_is_cancelled_and_its_rows_fail(api, client, sleeps):
    api.hold_tasks = True

    report = make_run(client, sleeps, rows=ROWS[:1],
                      poll=PollPolicy(long_poll_seconds=1, task_timeout_seconds=0.3)).execute()

    assert len(api.requests('DELETE')) == 1
    assert report.outcomes[0].status == RowStatus.FAILED
    assert report.outcomes[0].reason.startswith('cancelled: timed out after 0.3 s')


def test_a_rerank_run_gives_each_query_its_best_row(api, client, sleeps):
    report = Run.rerank(client, ['chest pain', 'fever'], ['angina', 'pyrexia'], sleep=sleeps).execute()

    assert [outcome.name for outcome in report.outcomes] == ['chest pain', 'fever']
    assert [outcome.top['name'] for outcome in report.outcomes] == ['angina', 'angina']
    assert sorted(post.body['q'] for post in api.posts()) == ['chest pain', 'fever']


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
