"""The lane nodes' heartbeats and published pools are timed by Redis's clock, not their host's (workers.pool).

On the real Redis: fakeredis's TIME is this process's clock, which the test sets ahead."""
import json
import time

from capacity.keys import pool_key
from tests.conftest import delete_prefixed, real_redis_client
from workers.pool import live_nodes, read_pools, server_time


def test_a_node_on_a_host_30_s_ahead_still_sees_the_other_node_and_its_fresh_pool(key_prefix, monkeypatch):
    """Before, the node ahead saw every other node expired and took a whole lane's pool beside theirs (the
    cluster's clock fault: interactive ran 2 processes for a pool of 1)."""
    client = real_redis_client()
    try:
        assert live_nodes(client, 'interactive', 'interactive@worker1', 6) == ['interactive@worker1']
        client.hset(pool_key('interactive'), 'interactive@worker1', json.dumps(
            {'processes': 1, 'consuming': True, 'updated': server_time(client)}))
        real = time.time
        monkeypatch.setattr(time, 'time', lambda: real() + 30)
        assert live_nodes(client, 'interactive', 'interactive@worker2', 6) == [
            'interactive@worker1', 'interactive@worker2']
        pools = read_pools(client, 'interactive')
        assert list(pools) == ['interactive@worker1']
        assert 0 <= pools['interactive@worker1']['age'] < 5
    finally:
        delete_prefixed(client, key_prefix)
        client.close()
