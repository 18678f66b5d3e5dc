"""The broker transport keeps one publishing client per channel, and still publishes to the right queue."""
import pytest
from django.conf import settings

from workers.broker import Transport
from workers.celery import app

pytestmark = pytest.mark.redis


def test_the_app_uses_the_transport_for_a_redis_url():
    assert settings.CELERY_BROKER_URL.startswith('redis://')
    assert isinstance(app.connection_for_write().transport, Transport)


def test_publishes_share_one_client_and_reach_the_queue(broker):
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS['global_keyprefix']
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        producer = connection.Producer(channel)
        for n in range(3):
            producer.publish({'n': n}, routing_key='hl-broker-test', exchange='',
                             declare=[app.amqp.queues.select_add('hl-broker-test') or
                                      app.amqp.queues['hl-broker-test']])
        assert broker.llen(prefix + 'hl-broker-test') == 3
        # A new pool (after a reconnect) gets a client of its own.
        old = first
        channel._pool = None
        with channel.conn_or_acquire() as client:
            assert client is not old and client.connection_pool is channel.pool
