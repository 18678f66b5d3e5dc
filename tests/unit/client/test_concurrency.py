"""Concurrency: a run keeps as many calls in flight as the server suggests, within its own cap."""
from tests.unit.client.helpers import make_run


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


def test_with_only_the_standard_ratelimit_fields_the_run_follows_their_room(api, client, sleeps):
    api.suggested = 2  # said as a concurrency quota of 2 in RateLimit-Policy / RateLimit alone
    api.standard_only = True
    api.task_seconds = 0.08

    report = make_run(client, sleeps, rows=[f'row {i}' for i in range(10)], batch_size=1,
                      max_concurrency=8).execute()

    assert api.max_open == 2 and report.summary.max_in_flight == 2 and report.ok
