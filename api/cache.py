"""Django's Redis cache, on the service's one Redis client factory (common.connections, role `cache`).

Django's RedisCacheClient builds its own connection pools from LOCATION and a new `redis.Redis` for every
cache operation. Here every operation uses this process's one `cache` client instead: it follows Sentinel
like every other Redis connection of the service, has the role's timeouts, and isn't rebuilt per call
(with redis-py 8 that construction, its response-callback table, costs about 0.1 ms of CPU, more than the
GET it wraps; the rate limit does a GET and a SET on every heavy call, bench/submission.py). A
`redis.Redis` is safe to share between threads (each command takes a connection from the pool), and its
pool reconnects in a forked child. Values are still (de)serialized by Django's client.
"""
from django.conf import settings
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient

from common import connections


class FactoryRedisCacheClient(RedisCacheClient):
    def get_client(self, key=None, *, write=False):
        location = self._servers[0]
        return connections.connect('cache', None if location == settings.REDIS_URL else location)


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = FactoryRedisCacheClient
