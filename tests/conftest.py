"""Shared fixtures: the two Redis backends, the PostgreSQL URL, users of each tier.

The lane-store contract runs on fakeredis (real Lua through lupa) and on a real Redis through one
parametrized fixture, `redis_client`. The real one lives at HEAVY_LANES_TEST_REDIS_URL (default
redis://127.0.0.1:6379/13); every test gets its own key prefix and its keys are deleted afterwards.

With HEAVY_LANES_REQUIRE_SERVICES=1 (CI), a missing service fails the test instead of skipping it, and any
skip at all fails the run.
"""
import os
import uuid

import pytest

REDIS_URL = os.environ.get('HEAVY_LANES_TEST_REDIS_URL', 'redis://127.0.0.1:6379/13')
DATABASE_URL = os.environ.get('HEAVY_LANES_TEST_DATABASE_URL', 'postgres://postgres@127.0.0.1:5432/test')
REQUIRE_SERVICES = os.environ.get('HEAVY_LANES_REQUIRE_SERVICES') == '1'


def missing_service(message):
    """Skip locally, fail in CI: a real backend that CI should have is never silently left out."""
    if REQUIRE_SERVICES:
        pytest.fail(f'{message} (HEAVY_LANES_REQUIRE_SERVICES=1)')
    pytest.skip(message)


USED_PREFIXES = []  # every key prefix this process handed out (key_prefix)


def pytest_sessionfinish(session, exitstatus):
    forget_used_prefixes()
    if REQUIRE_SERVICES and exitstatus == 0:
        reporter = session.config.pluginmanager.get_plugin('terminalreporter')
        if reporter is not None and reporter.stats.get('skipped'):
            reporter.write_line('FAILED: tests were skipped while HEAVY_LANES_REQUIRE_SERVICES=1', red=True)
            session.exitstatus = 1


PROMTOOL_DIRS = ('/opt/promtool/usr/bin',)  # where .ci/run unpacks Debian's prometheus package


def promtool():
    """The path of Prometheus's promtool (PROMTOOL, the PATH, or where .ci/run unpacks it), else a skip
    locally and a failure in CI."""
    import shutil
    unpacked = [os.path.join(directory, 'promtool') for directory in PROMTOOL_DIRS]
    found = os.environ.get('PROMTOOL') or shutil.which('promtool') or next(
        (path for path in unpacked if os.access(path, os.X_OK)), None)
    if not found:
        missing_service('no promtool (apt-get download prometheus && dpkg -x prometheus_*.deb /opt/promtool)')
    return found


def real_redis_client():
    import redis
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as ex:
        missing_service(f'no Redis at {REDIS_URL}: {ex}')
    return client


@pytest.fixture
def key_prefix(settings):
    """A key prefix of this test's own, so tests never see each other's lanes, even on one real Redis."""
    prefix = f'hltest:{uuid.uuid4().hex[:12]}'
    settings.CAPACITY_KEY_PREFIX = prefix
    USED_PREFIXES.append(prefix)
    return prefix


@pytest.fixture(params=['fakeredis', 'redis'])
def redis_client(request, key_prefix):
    """A Redis client of each kind; the test's keys (under its own prefix) are deleted afterwards."""
    if request.param == 'fakeredis':
        import fakeredis
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        yield client
        client.close()
        return
    client = real_redis_client()
    yield client
    delete_prefixed(client, key_prefix)
    client.close()


def forget_used_prefixes():
    """Delete, from the real Redis, the keys of every prefix this process used: a test deletes its own
    keys as it ends, but the capacity counters are sent by the Redis thread a moment after the increment
    (capacity.counters), sometimes after that deletion."""
    import redis
    if not USED_PREFIXES:
        return
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
    try:
        for prefix in USED_PREFIXES:
            delete_prefixed(client, prefix)
    except redis.RedisError:
        pass  # no real Redis here: nothing was left in it
    finally:
        client.close()


def delete_prefixed(client, prefix):
    """Delete a test's keys: lane keys start with the hash tag `{prefix}`, the others with `prefix`."""
    escaped = ''.join('\\' + ch if ch in '*?[]\\' else ch for ch in prefix)
    for pattern in (f'{escaped}*', '\\{' + escaped + '*'):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)


@pytest.fixture
def real_redis(key_prefix):
    """The real Redis only (for concurrency and fault tests); its keys are deleted afterwards."""
    client = real_redis_client()
    yield client
    delete_prefixed(client, key_prefix)
    client.close()


@pytest.fixture
def make_user(db):
    """make_user(tier_group=None, **fields) -> a user with a token; tier_group is a group name."""
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    def make(group=None, username=None, **fields):
        user = User.objects.create_user(username=username or f'u-{uuid.uuid4().hex[:8]}', password='pw', **fields)
        if group:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        Token.objects.create(user=user)
        return user
    return make


@pytest.fixture(autouse=True)
def fresh_caches():
    """Each test starts with no cached config, tiers, tokens or source versions (user ids are reused after a
    database flush, and a rolled-back change announces nothing)."""
    from capacity.caller import clear_tiers
    from concepts.services import forget_sources
    from workers import local_cache
    clear_tiers()
    forget_sources()
    local_cache.forget()
    yield
    clear_tiers()
    forget_sources()
    local_cache.forget()
