"""Django's Redis cache, with one redis-py client per connection pool instead of one per operation.

Django's RedisCacheClient builds a new `redis.Redis` for every cache operation. With redis-py 8 that
construction (its response-callback table) costs about 0.1 ms of CPU, more than the GET it wraps; the rate
limit does a GET and a SET on every heavy call (bench/submission.py). A `redis.Redis` is safe to share
between threads (each command takes a connection from the pool), and its pool reconnects in a forked child,
so one client per pool is kept.
"""
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class SharedClientRedisCacheClient(RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}  # pool index -> redis.Redis

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None or client.connection_pool is not pool:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = SharedClientRedisCacheClient
