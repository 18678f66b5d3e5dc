"""The rate limit's window in the lane store, on fakeredis and on the real Redis: the operation
(Operations.count_request, capacity/lua/rate.lua) admits while the window has room, refusals write nothing,
old requests leave it; the verb (LaneStore.count_request) fails open to Unknown."""
import pytest
import redis

from capacity.keys import rate_key
from capacity.operations import BadCall, Counted
from capacity.store import LaneStore, Unknown, get_store
from common import connections

WINDOW_MS = 60_000


def redis_now_ms(client):
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_requests_are_counted_up_to_the_limit_and_the_next_is_refused(store, redis_client):
    key = rate_key('heavy', 42)
    before = redis_now_ms(redis_client)
    answers = [store.count_request(key, f'r{n}', 3, WINDOW_MS) for n in range(5)]
    after = redis_now_ms(redis_client)
    assert [(answer.admitted, answer.in_window) for answer in answers] == [
        (True, 1), (True, 2), (True, 3), (False, 3), (False, 3)]
    # The first request is the oldest: the window frees a place when it leaves, a minute after it came.
    first_counted = min(score for _, score in redis_client.zrange(key, 0, -1, withscores=True))
    assert before <= first_counted <= after
    for answer in answers:
        assert first_counted + WINDOW_MS - after <= answer.reset_ms <= first_counted + WINDOW_MS - before
    # Scored by Redis's clock, one member per admitted request; the refused ones left nothing.
    assert sorted(member.decode() for member in redis_client.zrange(key, 0, -1)) == ['r0', 'r1', 'r2']


def test_a_request_older_than_the_window_no_longer_counts(store, redis_client):
    key = rate_key('heavy', 42)
    now = redis_now_ms(redis_client)
    redis_client.zadd(key, {'old': now - WINDOW_MS - 1, 'recent': now - 1000})
    answer = store.count_request(key, 'new', 2, WINDOW_MS)
    assert (answer.admitted, answer.in_window) == (True, 2)
    assert sorted(member.decode() for member in redis_client.zrange(key, 0, -1)) == ['new', 'recent']
    assert WINDOW_MS - 1000 - 50 <= answer.reset_ms <= WINDOW_MS - 1000  # until `recent` leaves it


def test_the_window_expires_with_its_newest_request_and_a_refusal_leaves_its_expiry_alone(store, redis_client):
    key = rate_key('heavy', 7)
    store.count_request(key, 'a', 1, WINDOW_MS)
    assert WINDOW_MS - 1000 < redis_client.pttl(key) <= WINDOW_MS
    redis_client.pexpire(key, 5000)
    assert store.count_request(key, 'b', 1, WINDOW_MS).admitted is False
    assert redis_client.pttl(key) <= 5000


def test_a_limit_of_zero_refuses_every_request_and_writes_nothing(store, redis_client):
    key = rate_key('heavy', 9)
    assert store.count_request(key, 'a', 0, WINDOW_MS) == Counted(False, 0, WINDOW_MS)
    assert redis_client.exists(key) == 0


def test_windows_are_per_key(store, redis_client):
    assert store.count_request(rate_key('heavy', 1), 'a', 1, WINDOW_MS).admitted is True
    assert store.count_request(rate_key('heavy', 2), 'a', 1, WINDOW_MS).admitted is True
    assert store.count_request(rate_key('heavy', 1), 'b', 1, WINDOW_MS).admitted is False


@pytest.mark.parametrize('limit, window_ms', [(-1, WINDOW_MS), (1, 0), ('many', WINDOW_MS)])
def test_a_nonsensical_call_is_raised_not_failed_open(store, redis_client, limit, window_ms):
    with pytest.raises(BadCall):
        get_store().count_request(rate_key('heavy', 1), 'a', limit, window_ms)
    assert get_store().is_available()


def test_skipped_or_failed_the_verb_answers_unknown_and_writes_nothing(store, redis_client):
    lanes = get_store()
    assert lanes.count_request(rate_key('heavy', 1), 'a', 1, WINDOW_MS) == Counted(True, 1, WINDOW_MS)
    lanes.mark_unavailable()
    skipped = lanes.count_request(rate_key('heavy', 1), 'b', 1, WINDOW_MS)
    assert isinstance(skipped, Unknown) and skipped.skipped and not skipped
    assert redis_client.zcard(rate_key('heavy', 1)) == 1  # nothing sent

    refused = LaneStore(redis.Redis(port=9, **connections.options('lanes')))  # nothing listens on discard
    failed = refused.count_request(rate_key('heavy', 1), 'a', 1, WINDOW_MS)
    assert isinstance(failed, Unknown) and not failed.skipped and failed.error.startswith('ConnectionError')
    assert not refused.is_available()  # a Redis error opens the skip window
