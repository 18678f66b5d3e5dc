"""kombu's Redis transport, with three changes the service depends on.

1. One redis-py client per channel for publishing. kombu's Redis channel builds a new `redis.Redis`
   around its connection pool for every message it publishes; with redis-py 8 that construction costs
   about 0.1 ms of CPU, as much as the LPUSH it wraps (bench/submission.py). The client holds no state of
   its own, so the channel keeps one, and builds a new one when its pool changes (after a reconnect).
2. No redis-py retries on the channel's synchronous connections (publish, ack, restore): a command fails
   at its socket timeout instead of being retried with backoff for many seconds while Redis stalls.
   kombu's own publish retry (task_publish_retry_policy) and the publisher's deadline (workers.publisher)
   bound the request path; an acknowledgement is settled as below.
3. An acknowledgement that can't reach Redis no longer costs the worker a prefetch slot. kombu's QoS frees
   the slot only after Redis confirmed the ack; when that raised (a Redis stall), the message stayed
   "delivered" for good and a lane with a pool of two ran one call at a time until a restart. Here the
   slot is freed at once, the message's unacked entry is removed on the next ack that reaches Redis, and
   until then it is counted (`ack_status()`, shown per node in /capacity/status/). An entry never
   removed only means the broker delivers the message again after its visibility timeout, and the worker
   then finds the call ended and doesn't run it (workers.lifecycle.start).

`Transport` serves `redis://` and `rediss://` broker URLs, `SentinelTransport` the `sentinel://` ones that
api/settings.py builds from REDIS_SENTINELS_LIST (kombu's Sentinel transport, which asks the Sentinels for
the primary on every new connection, with the same three changes: before, a Sentinel deployment lost them).
The consuming side (the asynchronous client) is kombu's own.
"""
import logging
import weakref

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger('heavy_lanes')

_qos = weakref.WeakSet()  # this process's QoS objects, for ack_status()
_failed = [0]  # acknowledgements that couldn't reach Redis, since this process started


class QoS(kombu_redis.QoS):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unsettled = set()  # delivery tags acked here whose unacked entry is still in Redis
        _qos.add(self)

    def ack(self, delivery_tag):
        self._settle(delivery_tag)
        virtual.QoS.ack(self, delivery_tag)  # frees the prefetch slot, whatever Redis said

    def reject(self, delivery_tag, requeue=False):
        if requeue:
            try:
                self.restore_by_tag(delivery_tag, leftmost=True)
            finally:
                virtual.QoS.ack(self, delivery_tag)
            return
        self.ack(delivery_tag)

    def _settle(self, delivery_tag):
        tags = [delivery_tag, *self.unsettled]
        try:
            with self.pipe_or_acquire() as pipe:
                for tag in tags:
                    self._remove_from_indices(tag, pipe)
                pipe.execute()
        except redis.RedisError as ex:
            self.unsettled.add(delivery_tag)
            _failed[0] += 1
            logger.warning('Broker acknowledgement failed (%s: %s); the slot is freed and the ack is sent again '
                           'with the next one (%d waiting)', type(ex).__name__, ex, len(self.unsettled))
            return
        if len(tags) > 1:
            logger.info('Broker acknowledgements settled: %d sent again', len(tags) - 1)
        self.unsettled.clear()


class _Changes:
    """The channel's changes (1 to 3 above), over kombu's plain or Sentinel channel."""

    QoS = QoS
    _publish_client = None

    def _connparams(self, asynchronous=False):
        params = super()._connparams(asynchronous=asynchronous)
        if not asynchronous:
            params['retry'] = Retry(NoBackoff(), 0)
        return params

    def _create_client(self, asynchronous=False):
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._publish_client
        if client is None or client.connection_pool is not self.pool:
            client = self._publish_client = super()._create_client()
        return client


class Channel(_Changes, kombu_redis.Channel):
    pass


class SentinelChannel(_Changes, kombu_redis.SentinelChannel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def ack_status():
    """{'failed_total', 'unsettled'}: this process's acknowledgements that couldn't reach Redis."""
    return {'failed_total': _failed[0], 'unsettled': sum(len(qos.unsettled) for qos in list(_qos))}
