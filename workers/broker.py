"""kombu's Redis transport, with one redis-py client per channel for publishing.

kombu's Redis channel builds a new `redis.Redis` around its connection pool for every message it
publishes. With redis-py 8 that construction costs about 0.1 ms of CPU, as much as the LPUSH it wraps, on
every heavy call's submission (bench/submission.py). The client holds no state of its own (each command
takes a connection from the pool), so the channel keeps one, and builds a new one when its pool changes
(after a reconnect). The consuming side (the asynchronous client) is kombu's own.

Used only for `redis://` and `rediss://` broker URLs (api/settings.py); a `sentinel://` URL keeps kombu's
Sentinel transport.
"""
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _publish_client = None

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._publish_client
        if client is None or client.connection_pool is not self.pool:
            client = self._publish_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
