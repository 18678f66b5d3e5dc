"""The broker through Redis Sentinel (REDIS_SENTINELS: api/settings.py builds `sentinel://` URLs) uses the
service's own transport, as a plain Redis URL does: one publishing client per channel and acknowledgements
that never cost a prefetch slot (workers/broker.py). Against a real primary, replica and Sentinel started
here: messages go to the primary the Sentinel names, and after a failover to the new one."""
import time

import pytest
import redis
from kombu import Connection

from devstack.processes import Child, free_port, stop_children
from devstack.redis_server import server_argv, server_binary
from tests.integration.workers.conftest import wait_until
from workers.broker import QoS, SentinelTransport

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def sentinel_set(tmp_path):
    if server_binary() is None:
        pytest.skip('redis-server is not installed')
    primary, replica, sentinel = free_port(), free_port(), free_port()
    conf = tmp_path / 'sentinel.conf'
    primary_dir, replica_dir = tmp_path / 'primary', tmp_path / 'replica'
    primary_dir.mkdir()
    replica_dir.mkdir()
    conf.write_text(f'port {sentinel}\nbind 127.0.0.1\ndir {tmp_path}\n'
                    f'sentinel monitor hl-test 127.0.0.1 {primary} 1\n'
                    'sentinel down-after-milliseconds hl-test 1000\nsentinel failover-timeout hl-test 5000\n')
    children = [
        # Each in its own directory: a replica's first sync writes the primary's snapshot there.
        Child('primary', server_argv(primary, data_dir=primary_dir), tmp_path / 'primary.log').start(),
        Child('replica', [*server_argv(replica, data_dir=replica_dir), '--replicaof', '127.0.0.1', str(primary)],
              tmp_path / 'replica.log').start(),
        Child('sentinel', ['redis-server', str(conf), '--sentinel'], tmp_path / 'sentinel.log').start(),
    ]
    clients = {port: redis.Redis(port=port, socket_timeout=2) for port in (primary, replica, sentinel)}

    def answers(port):
        try:
            return clients[port].ping()
        except redis.RedisError:
            return False
    try:
        wait_until(lambda: all(answers(port) for port in clients), timeout=20, message='Redis and the Sentinel')
        wait_until(lambda: clients[replica].info('replication').get('master_link_status') == 'up', timeout=20,
                   message='the replica to sync')
        yield primary, replica, sentinel, clients
    finally:
        for client in clients.values():
            client.close()
        stop_children(children)


def test_a_sentinel_broker_uses_the_services_transport_and_follows_a_failover(sentinel_set):
    primary, replica, sentinel, clients = sentinel_set
    options = {'master_name': 'hl-test', 'socket_timeout': 2.0}
    with Connection(f'sentinel://127.0.0.1:{sentinel}/0', transport=SentinelTransport,
                    transport_options=options) as connection:
        channel = connection.default_channel
        assert isinstance(channel.qos, QoS)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second  # one publishing client per channel
        producer = connection.Producer(channel)
        producer.publish({'n': 1}, routing_key='hl-sentinel-test', exchange='')
        assert clients[primary].llen('hl-sentinel-test') == 1

        def failover():  # refused (NOGOODSLAVE) until the Sentinel has found the replica and read its state
            try:
                return clients[sentinel].execute_command('SENTINEL', 'FAILOVER', 'hl-test')
            except redis.ResponseError:
                return False
        wait_until(failover, timeout=40, interval=0.5, message='the Sentinel to take a failover')
        wait_until(lambda: clients[sentinel].execute_command(
            'SENTINEL', 'get-master-addr-by-name', 'hl-test')[1] == str(replica).encode(), timeout=20,
            message='the Sentinel to promote the replica')
        wait_until(lambda: clients[replica].info('replication')['role'] == 'master'
                   and clients[primary].info('replication')['role'] == 'slave', timeout=30,
                   message='the failover to end: the replica the primary, the old primary its replica')
        deadline = time.monotonic() + 20
        while True:  # the old primary's connection fails once (READONLY or reset); kombu connects again
            try:
                connection.ensure_connection(max_retries=3)
                producer = connection.Producer(connection.default_channel)
                producer.publish({'n': 2}, routing_key='hl-sentinel-test', exchange='')
                break
            except Exception:  # noqa: BLE001 - the failover's one failed publish
                assert time.monotonic() < deadline
                connection.close()
                time.sleep(0.5)
        lengths = (clients[primary].llen('hl-sentinel-test'), clients[replica].llen('hl-sentinel-test'))
        assert lengths[1] == 2, lengths  # the first came over by replication
