"""The rate limit through the real HTTP stack: 2,000 lexical `$match` requests of one user, 64 at a time,
over two gunicorn API processes (32 threads each) sharing the test's own redis-server, against
HEAVY_RATE_LIMIT 600/min. Exactly 600 are answered 200, the other 1,400 `429 rate_limited` with a
Retry-After and the RateLimit fields, and the window in Redis holds exactly the 600 admitted."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import http_sf
import pytest
import requests

from capacity.keys import rate_key

pytestmark = [pytest.mark.slow, pytest.mark.redis]
REQUESTS, CONCURRENCY, RATE, WINDOW_SECONDS = 2000, 64, 600, 60


def rate_item(response, header):
    return dict(dict(http_sf.parse(response.headers[header].encode(), tltype='list'))['rate'])


def test_2000_concurrent_lexical_requests_against_600_a_minute_get_exactly_600_answers(
        fault_stack, tiny_source, make_user):
    fault_stack.common['HEAVY_RATE_LIMIT'] = f'{RATE}/min'
    urls = [fault_stack.api('api-a', threads=CONCURRENCY // 2), fault_stack.api('api-b', threads=CONCURRENCY // 2)]
    user = make_user()
    headers = {'Authorization': f'Token {user.auth_token.key}'}
    body = {'rows': [{'name': 'high blood pressure'}], 'target_repo_url': tiny_source}
    sessions = threading.local()
    start = threading.Barrier(CONCURRENCY)

    def send(n):
        if n < CONCURRENCY:
            start.wait()  # the first 64 go at once; then each client sends its next as soon as it is answered
        session = getattr(sessions, 'session', None) or requests.Session()
        sessions.session = session
        response = session.post(f'{urls[n % 2]}/concepts/$match/', json=body, headers=headers, timeout=60)
        return response, time.monotonic()

    started = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(send, range(REQUESTS)))
    # Exact only within one window: the first admitted request leaves it a minute later.
    assert max(at for _, at in answers) - started < WINDOW_SECONDS

    codes = [response.status_code for response, _ in answers]
    assert codes.count(200) == RATE and codes.count(429) == REQUESTS - RATE, {c: codes.count(c) for c in set(codes)}
    admitted = [response for response, _ in answers if response.status_code == 200]
    refused = [response for response, _ in answers if response.status_code == 429]
    assert all(response.json()[0]['results'] for response in admitted)  # real answers, one entry per row
    assert sorted(RATE - rate_item(response, 'RateLimit')['r'] for response in admitted) == list(range(1, RATE + 1))
    for response in refused:
        assert response.json()['error_code'] == 'rate_limited'
        assert 1 <= int(response.headers['Retry-After']) <= WINDOW_SECONDS
        assert rate_item(response, 'RateLimit-Policy') == {'q': RATE, 'w': WINDOW_SECONDS}
        assert rate_item(response, 'RateLimit')['r'] == 0
    lanes = fault_stack.lanes()
    try:
        assert lanes.zcard(rate_key('heavy', user.pk)) == RATE
    finally:
        lanes.close()
