"""Tokens kept by the API processes (workers.local_cache, api.authentication), on the real stack: two
gunicorn API hosts and the test's own redis-server. A token that is deleted, or whose user is deactivated,
is refused by every host as soon as the change commits, though the hosts would keep it for ten minutes; a
host whose subscription was cut drops what it kept when it is back."""
import time

import pytest
import requests
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token

from common import connections

pytestmark = [pytest.mark.slow, pytest.mark.redis]
KEPT_SECONDS = 600  # far longer than any test: a refusal here comes from an invalidation, never from age
PROMPT_SECONDS = 1.0  # an announced change reaches every host within this (one pub/sub hop, a loaded machine)


def status(url, token):
    """The status of an authenticated read that touches nothing else: an unknown task is 404, a bad token 401."""
    return requests.get(f'{url}/tasks/00000000-0000-0000-0000-000000000000/',
                        headers={'Authorization': f'Token {token}'}, timeout=10).status_code


def refused_within(urls, token, seconds):
    """How long it took until every host refused `token` (401), or None if one still took it after `seconds`."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if all(status(url, token) == 401 for url in urls):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


@pytest.fixture
def hosts(fault_stack, settings):
    """Two API hosts that keep tokens for KEPT_SECONDS, with this process announcing on the stack's Redis."""
    settings.REDIS_HOST, settings.REDIS_PORT, settings.REDIS_DB = '127.0.0.1', fault_stack.redis_server.port, 0
    settings.REDIS_URL = fault_stack.lanes_url
    connections.forget()
    fault_stack.common['HEAVY_LANES_LOCAL_CACHE_SECONDS'] = KEPT_SECONDS
    yield [fault_stack.api('api-a', threads=4), fault_stack.api('api-b', threads=4)]
    connections.forget()


def kept_everywhere(urls, user):
    """Use `user`'s token on every host, then change its key behind the hosts' backs (a QuerySet.update sends
    no signal): a host that still takes the old key kept it. Returns the old key."""
    key = user.auth_token.key
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a host keeps nothing until its subscriber is connected
        assert all(status(url, key) == 404 for url in urls)
        Token.objects.filter(user=user).update(key=key[::-1])
        kept = all(status(url, key) == 404 for url in urls)
        Token.objects.filter(user=user).update(key=key)
        if kept:
            return key
        time.sleep(0.2)
    raise AssertionError('the hosts never kept the token')


def test_a_deleted_token_or_a_deactivated_user_is_refused_by_every_host_once_the_change_commits(
        hosts, make_user):
    deleted, deactivated, renamed = make_user(), make_user(), make_user()
    for user in (deleted, deactivated):
        kept_everywhere(hosts, user)

    key = deleted.auth_token.key
    deleted.auth_token.delete()
    assert (took := refused_within(hosts, key, PROMPT_SECONDS)) is not None, 'a deleted token still works'

    key = deactivated.auth_token.key
    deactivated.is_active = False
    deactivated.save()
    assert refused_within(hosts, key, PROMPT_SECONDS) is not None, "a deactivated user's token still works"

    # A key changed with no signal stays kept (the documented bound) until any user is saved.
    key = kept_everywhere(hosts, renamed)  # saving a user dropped every kept token: kept again
    Token.objects.filter(user=renamed).update(key=key[::-1])
    assert all(status(url, key) == 404 for url in hosts)
    User.objects.get(pk=renamed.pk).save(update_fields=['last_login'])  # a login: changes no token
    assert all(status(url, key) == 404 for url in hosts)
    User.objects.get(pk=renamed.pk).save()
    assert refused_within(hosts, key, PROMPT_SECONDS) is not None
    assert all(status(url, key[::-1]) == 404 for url in hosts)  # its new key works
    print(f'deleted token refused everywhere after {took:.3f} s')


def test_a_host_whose_subscription_was_cut_drops_what_it_kept(hosts, make_user, fault_stack):
    user = make_user()
    key = kept_everywhere(hosts, user)
    Token.objects.filter(user=user).update(key=key[::-1])  # unannounced: only a reconnect can drop it
    assert all(status(url, key) == 404 for url in hosts)
    client = fault_stack.lanes()
    try:
        assert client.client_kill_filter(_type='pubsub') >= 2  # each host's notice hub
    finally:
        client.close()
    # The hub sees its connection closed, reconnects after notify.RECONNECT_SECONDS and drops all it kept;
    # meanwhile it keeps nothing new.
    assert refused_within(hosts, key, 5) is not None, 'a host kept a token across a lost subscription'
    assert all(status(url, key[::-1]) == 404 for url in hosts)


def test_a_token_deleted_while_redis_is_paused_is_refused_within_the_bound(fault_stack, settings, make_user):
    """Redis stopped (SIGSTOP) when the token is deleted: the announcement can't be sent in time, and the
    host refuses the token at the latest HEAVY_LANES_LOCAL_CACHE_SECONDS after it last read it."""
    settings.REDIS_HOST, settings.REDIS_PORT, settings.REDIS_DB = '127.0.0.1', fault_stack.redis_server.port, 0
    settings.REDIS_URL = fault_stack.lanes_url
    connections.forget()
    bound = 4
    fault_stack.common['HEAVY_LANES_LOCAL_CACHE_SECONDS'] = bound
    url = fault_stack.api('api-a', threads=4)
    user = make_user()
    key = user.auth_token.key
    assert status(url, key) == 404
    read_at = time.monotonic()
    fault_stack.redis_server.pause()
    try:
        Token.objects.filter(user=user).delete()  # announced after commit: Redis doesn't answer
        refused = refused_within([url], key, bound + 2)
    finally:
        fault_stack.redis_server.resume()
        connections.forget()
    assert refused is not None and time.monotonic() - read_at < bound + 2
