"""The rate limit (api.throttles): exact under concurrency on both backends, one window for lexical and heavy
calls, failing open on the lane store's skip window and on a Redis error. (DRF's throttle, which read its
history and wrote it back, admitted 1,921 of the 2,000 concurrent requests of the first test.)"""
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import redis

from api.throttles import HeavyRateThrottle
from capacity.keys import rate_key
from capacity.operations import Operations
from capacity.store import LaneStore, get_store, use_store
from common import connections
from tests.integration.capacity.conftest import SilentServer

REQUESTS, CONCURRENCY, RATE = 2000, 64, 600
ROWS = [{'name': 'high blood pressure'}]


def caller(pk):
    return SimpleNamespace(user=SimpleNamespace(pk=pk, is_authenticated=True))


VIEW = SimpleNamespace(throttle_scope='heavy')


@pytest.fixture
def rate(monkeypatch):
    def rate(value):
        monkeypatch.setitem(HeavyRateThrottle.THROTTLE_RATES, 'heavy', value)
    rate(f'{RATE}/min')
    return rate


def test_2000_concurrent_requests_against_600_a_minute_admit_exactly_600(lanes, rate):
    start = threading.Barrier(CONCURRENCY)

    def check(n):
        if n < CONCURRENCY:
            start.wait()  # the first 64 go at once, then each thread sends its next as soon as it is answered
        throttle = HeavyRateThrottle()
        return throttle.allow_request(caller(7), VIEW), throttle.quota(), throttle.wait()

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(check, range(REQUESTS)))
    admitted = [quota for allowed, quota, _ in answers if allowed]
    refused = [(quota, wait) for allowed, quota, wait in answers if not allowed]
    assert len(admitted) == RATE and len(refused) == REQUESTS - RATE
    # Each place in the window was taken by exactly one request, and every check was counted in Redis.
    assert sorted(RATE - quota.remaining for quota in admitted) == list(range(1, RATE + 1))
    assert {quota.remaining for quota, _ in refused} == {0}
    assert all(0 < wait <= 60 for _, wait in refused)
    assert lanes.zcard(rate_key('heavy', 7)) == RATE


def test_callers_have_windows_of_their_own(lanes, rate):
    rate('2/min')
    assert [HeavyRateThrottle().allow_request(caller(pk), VIEW) for pk in (1, 1, 2, 1, 2, 2)] == [
        True, True, True, False, True, False]


def test_the_lane_stores_skip_window_lets_the_call_through_uncounted(lanes, rate):
    rate('1/min')
    get_store().mark_unavailable()
    throttles = [HeavyRateThrottle() for _ in range(3)]
    assert all(throttle.allow_request(caller(7), VIEW) for throttle in throttles)
    assert [throttle.quota() for throttle in throttles] == [None] * 3  # no RateLimit item: nothing counted
    assert lanes.exists(rate_key('heavy', 7)) == 0


def test_a_redis_error_lets_the_call_through_logs_once_and_opens_the_skip_window(db, rate, caplog):
    broken = redis.Redis(port=9, **connections.options('lanes'))  # nothing listens on the discard port
    store = use_store(LaneStore(broken))
    try:
        with caplog.at_level(logging.WARNING, logger='heavy_lanes'):
            throttles = [HeavyRateThrottle() for _ in range(3)]
            assert all(throttle.allow_request(caller(7), VIEW) for throttle in throttles)
        assert [throttle.quota() for throttle in throttles] == [None] * 3
        assert not store.is_available()
        lines = [record.getMessage() for record in caplog.records if 'rate limit' in record.getMessage()]
        assert len(lines) == 1 and 'failed open' in lines[0] and 'ConnectionError' in lines[0]
    finally:
        use_store(None)


def test_a_redis_that_never_answers_costs_a_check_at_most_the_deadline_then_none(db, rate, settings):
    server = SilentServer()  # accepts the connection, never answers: a hung Redis
    store = use_store(LaneStore(redis.Redis(port=server.port, **connections.options('lanes'))))
    try:
        started = time.monotonic()
        assert HeavyRateThrottle().allow_request(caller(7), VIEW) is True
        assert time.monotonic() - started < settings.CAPACITY_REDIS_DEADLINE_SECONDS + 0.5  # loaded machine slack
        assert not store.is_available()
        started = time.monotonic()
        assert HeavyRateThrottle().allow_request(caller(7), VIEW) is True
        assert time.monotonic() - started < 0.1  # the skip window: Redis isn't asked
    finally:
        use_store(None)
        server.stop()


def test_no_rate_means_no_limit(lanes, rate, monkeypatch):
    monkeypatch.delitem(HeavyRateThrottle.THROTTLE_RATES, 'heavy')
    monkeypatch.setitem(HeavyRateThrottle.THROTTLE_RATES, 'other', None)
    throttle = HeavyRateThrottle()
    assert throttle.allow_request(caller(7), SimpleNamespace(throttle_scope='other')) is True
    assert throttle.quota() is None and throttle.wait() is None


# --- over HTTP, in process

def lexical(client, source):
    return client.post('/concepts/$match/', {'rows': ROWS, 'target_repo_url': source}, format='json')


def heavy(client, source, name):
    return client.post('/concepts/$match/?semantic=true', {'rows': [{'name': name}], 'target_repo_url': source},
                       format='json', HTTP_PREFER='respond-async')


@pytest.mark.redis
def test_lexical_and_heavy_calls_share_one_window(broker, lanes_redis, tiny_source, make_user, api_as, rate):
    rate('2/min')
    user = make_user()
    client = api_as(user)
    answers = [lexical(client, tiny_source), heavy(client, tiny_source, 'fever'), lexical(client, tiny_source),
               heavy(client, tiny_source, 'cough')]
    assert [answer.status_code for answer in answers] == [200, 202, 429, 429]
    assert {answer.json()['error_code'] for answer in answers[2:]} == {'rate_limited'}
    assert all(58 <= int(answer['Retry-After']) <= 60 for answer in answers[2:])
    assert lanes_redis.zcard(rate_key('heavy', user.pk)) == 2  # the refused ones were not counted


@pytest.mark.redis
def test_a_failing_rate_limit_lets_a_heavy_call_through_without_its_ratelimit_item(
        broker, lanes_redis, tiny_source, make_user, api_as, rate, monkeypatch):
    def down(*args, **kwargs):
        raise redis.ConnectionError('refused')
    monkeypatch.setattr(Operations, 'count_request', down)
    response = heavy(api_as(make_user()), tiny_source, 'fever')
    assert response.status_code == 202
    assert response['X-OCL-Capacity-Decision'] == 'admitted'  # the gate had counted it before
    assert 'rate' not in response['RateLimit-Policy']
