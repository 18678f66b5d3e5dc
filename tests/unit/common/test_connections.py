"""The limiter's own Redis client: short timeouts, no retries, Sentinel when configured.

These build real redis-py objects (nothing connects until a command runs) and read back their settings;
tests/integration/capacity/test_store_faults.py shows the same settings against servers that hang.
"""
import pytest
from redis.sentinel import SentinelConnectionPool

from capacity.store import build_redis_client


@pytest.fixture
def redis_settings(settings):
    settings.REDIS_HOST = 'redis.example'
    settings.REDIS_PORT = '6380'  # from the environment it can be a string
    settings.REDIS_DB = 2
    settings.REDIS_PASSWORD = 'secret'
    settings.REDIS_SENTINELS = False
    settings.CAPACITY_REDIS_TIMEOUT_SECONDS = 0.25
    return settings


def test_the_client_has_short_timeouts_and_no_retries(redis_settings):
    client = build_redis_client()
    options = client.connection_pool.connection_kwargs
    assert (options['host'], options['port'], options['db'], options['password']) == (
        'redis.example', 6380, 2, 'secret')
    assert options['socket_timeout'] == 0.25
    assert options['socket_connect_timeout'] == 0.25
    assert options['health_check_interval'] == 0
    assert options['retry'].get_retries() == 0
    assert client.get_retry().get_retries() == 0


def test_the_client_finds_the_master_through_the_sentinels(redis_settings):
    redis_settings.REDIS_SENTINELS = True
    redis_settings.REDIS_SENTINELS_LIST = [('sentinel-a', 26379), ('sentinel-b', 26380)]
    redis_settings.REDIS_SENTINELS_MASTER = 'primary'
    client = build_redis_client()
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == 'primary'
    master = pool.connection_kwargs
    assert (master['db'], master['password'], master['socket_timeout'], master['socket_connect_timeout']) == (
        2, 'secret', 0.25, 0.25)
    assert master['retry'].get_retries() == 0
    assert master['health_check_interval'] == 0
    sentinels = [sentinel.connection_pool.connection_kwargs for sentinel in pool.sentinel_manager.sentinels]
    assert [(s['host'], s['port']) for s in sentinels] == [('sentinel-a', 26379), ('sentinel-b', 26380)]
    for options in sentinels:
        assert (options['socket_timeout'], options['socket_connect_timeout'], options['password']) == (
            0.25, 0.25, 'secret')
        assert options['retry'].get_retries() == 0


def test_sentinels_get_no_password_when_redis_has_none(redis_settings):
    redis_settings.REDIS_SENTINELS = True
    redis_settings.REDIS_SENTINELS_LIST = [('sentinel-a', 26379)]
    redis_settings.REDIS_PASSWORD = None
    client = build_redis_client()
    (sentinel,) = client.connection_pool.sentinel_manager.sentinels
    assert sentinel.connection_pool.connection_kwargs['password'] is None
    assert client.connection_pool.connection_kwargs['password'] is None
