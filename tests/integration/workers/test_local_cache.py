"""Facts kept per process (workers.local_cache): read through while the notice hub is connected, dropped
by an announced change, by a change of the hub's connection and by age, and never kept from a read that
an invalidation overtook. With the real Redis, in this process."""
import time
import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.exceptions import AuthenticationFailed

from api.authentication import KeptTokenAuthentication
from capacity.keys import invalidation_channel
from common import connections
from workers import local_cache, notify
from workers.local_cache import LocalCache

pytestmark = pytest.mark.redis


@pytest.fixture
def hub():
    hub = notify.get_hub()
    hub.start()
    assert hub.connected.wait(5)
    LocalCache('warm-up').get('x', lambda: None)  # this process's listener is registered from here on
    return hub


def counted(value='v'):
    loads = []

    def load():
        loads.append(1)
        return value
    return load, loads


def heard(predicate, seconds=2.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def drained():
    """Once the hub has handled an invalidation published now, it has handled every earlier one (one
    connection, in order): what a fixture announced as it committed (tiny_source's load) can't drop, a moment
    later, what the test keeps next."""
    barrier = LocalCache(f'barrier-{uuid.uuid4().hex}')
    load, loads = counted()
    barrier.get('k', load)
    connections.connect('notices').publish(invalidation_channel(), f'{barrier.name}\nk')  # not announce():
    assert heard(lambda: barrier.get('k', load) and len(loads) == 2)  # that drops it here at once


def test_a_fact_is_read_once_and_dropped_by_its_announcement_only(hub):
    cache, other = LocalCache(f'a-{uuid.uuid4().hex}'), LocalCache(f'b-{uuid.uuid4().hex}')
    load, loads = counted()
    assert [cache.get('k', load) for _ in range(3)] == ['v'] * 3 and len(loads) == 1
    other_load, other_loads = counted()
    other.get('k', other_load)

    local_cache.announce(other.name, 'k')  # another kind's change leaves this one kept
    assert heard(lambda: other.get('k', other_load) and len(other_loads) == 2)
    cache.get('k', load)
    assert len(loads) == 1

    connections.connect('notices').publish(invalidation_channel(), f'{cache.name}\n')  # all of the kind
    assert heard(lambda: cache.get('k', load) and len(loads) == 2)
    connections.connect('notices').publish(invalidation_channel(), f'{cache.name}\nk')  # one fact
    assert heard(lambda: cache.get('k', load) and len(loads) == 3)


def test_nothing_is_kept_while_the_hub_is_not_connected(monkeypatch):
    deaf = notify.Hub()
    monkeypatch.setattr(deaf, 'run', lambda: None)  # never connects
    monkeypatch.setattr(notify, 'get_hub', lambda: deaf)
    cache = LocalCache(f'c-{uuid.uuid4().hex}')
    load, loads = counted()
    for _ in range(3):
        cache.get('k', load)
    assert len(loads) == 3


def test_a_read_overtaken_by_an_invalidation_is_not_kept(hub):
    cache = LocalCache(f'd-{uuid.uuid4().hex}')
    loads = []

    def load():
        loads.append(1)
        if len(loads) == 1:  # the change's message comes while the first read runs
            local_cache.announce(cache.name, 'k')
            assert heard(lambda: len(loads) and local_cache._kept.get().generation > generation)
        return len(loads)
    generation = local_cache._kept.get().generation
    assert cache.get('k', load) == 1
    assert cache.get('k', load) == 2 and cache.get('k', load) == 2  # the second read was kept


def test_a_lost_or_new_connection_drops_everything(hub):
    cache = LocalCache(f'e-{uuid.uuid4().hex}')
    load, loads = counted()
    cache.get('k', load)
    hub.tell('lost')
    cache.get('k', load)
    hub.tell('connected')
    cache.get('k', load)
    cache.get('k', load)
    assert len(loads) == 3


def test_a_fact_expires_and_zero_seconds_keeps_nothing(hub, settings):
    cache = LocalCache(f'f-{uuid.uuid4().hex}')
    load, loads = counted()
    settings.HEAVY_LANES_LOCAL_CACHE_SECONDS = 1
    cache.get('k', load)
    cache.get('k', load)
    time.sleep(1.05)
    cache.get('k', load)
    assert len(loads) == 2
    settings.HEAVY_LANES_LOCAL_CACHE_SECONDS = 0
    cache.get('k', load)
    cache.get('k', load)
    assert len(loads) == 4


def announced(pubsub, name, seconds):
    """The announcements of `name` heard within `seconds` (other test processes announce on the same channel)."""
    heard, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        message = pubsub.get_message(timeout=left)
        if message and message['data'].split(b'\n')[0] == name.encode():
            heard.append(message['data'].decode())
    return heard


def test_a_change_is_dropped_here_at_once_and_announced_only_when_it_commits(hub, transactional_db):
    cache = LocalCache(f'g-{uuid.uuid4().hex}')
    load, loads = counted()
    pubsub = connections.build('notices').pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(invalidation_channel())
    try:
        cache.get('k', load)
        with transaction.atomic():
            local_cache.changed(cache.name, 'k')
            cache.get('k', load)  # this process reads its own change
            assert len(loads) == 2
            assert announced(pubsub, cache.name, 0.3) == []  # others read the old value until the commit
        assert announced(pubsub, cache.name, 1) == [f'{cache.name}\nk']
        with transaction.atomic():
            local_cache.changed(cache.name, 'k')
            transaction.set_rollback(True)
        assert announced(pubsub, cache.name, 0.3) == []  # a rolled-back change is never announced
    finally:
        pubsub.close()


def test_token_authentication_reads_a_kept_token_without_a_query_and_hands_out_copies(hub, make_user):
    user = make_user()
    auth = KeptTokenAuthentication()
    key = user.auth_token.key
    first, token = auth.authenticate_credentials(key)
    first.note = 'set by a request'
    with CaptureQueriesContext(connection) as queries:
        second, again = auth.authenticate_credentials(key)
    assert len(queries) == 0
    assert second.pk == user.pk and again.key == key and again.user is second
    assert second is not first and not hasattr(second, 'note')
    with pytest.raises(AuthenticationFailed):
        auth.authenticate_credentials('not-a-token')
    user.auth_token.delete()  # the signal drops it here at once (and announces it on commit)
    with pytest.raises(AuthenticationFailed):
        auth.authenticate_credentials(key)


def test_an_inactive_user_is_refused_each_time(hub, make_user):
    user = make_user(is_active=False)
    auth = KeptTokenAuthentication()
    for _ in range(2):
        with pytest.raises(AuthenticationFailed):
            auth.authenticate_credentials(user.auth_token.key)


def test_the_work_key_reads_a_source_version_once_and_a_saved_source_changes_it_at_once(hub, tiny_source):
    from concepts.models import Source
    from workers.sharing import work_key
    payload = {'body': {'rows': [{'name': 'x'}], 'target_repo_url': tiny_source}}
    drained()  # the source's load announced its change on commit: the hub drops the kept version when it hears it
    first = work_key('$match', payload, semantic=True)
    with CaptureQueriesContext(connection) as queries:
        assert work_key('$match', payload, semantic=True) == first
    assert len(queries) == 0
    source = Source.objects.get(org='HL', mnemonic='TinyClinical')
    source.version = 'v-next'
    source.save()
    assert work_key('$match', payload, semantic=True) != first
