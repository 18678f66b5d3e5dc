"""An acquire's deadline is on Redis's clock (capacity.operations.RedisClock), on the real Redis only:
fakeredis's TIME is this process's clock, which the test sets behind."""
import time

from capacity import operations
from capacity.constants import Lane
from capacity.keys import lane_key
from capacity.store import LaneStore, use_store
from tests.conftest import delete_prefixed, real_redis_client

LEASE_MS = 60_000


def test_a_host_whose_clock_is_30_s_behind_redis_still_takes_leases(key_prefix, monkeypatch):
    """From the host's own clock alone, every acquire of a host more than the slack behind was refused as
    late. The first answer tells the offset; the call is sent once more on it, and the next needs no retry."""
    client = real_redis_client()
    store = use_store(LaneStore(client)).ops
    try:
        monkeypatch.setattr(operations, 'CLOCK', operations.RedisClock())
        real = time.time
        monkeypatch.setattr(time, 'time', lambda: real() - 30)
        keys = [lane_key(Lane.API_HEAVY), lane_key(Lane.TIER, 'preview'), lane_key(Lane.USER, 42)]
        first = store.acquire(keys, [4, 4, 4], 'call-1', LEASE_MS, force=False)
        assert first.taken and abs(operations.CLOCK.offset_ms - 30_000) < 1_000
        assert store.acquire(keys, [4, 4, 4], 'call-2', LEASE_MS, force=False).taken
        assert [member.decode() for member in client.zrange(keys[0], 0, -1)] == ['call-1', 'call-2']
    finally:
        use_store(None)
        delete_prefixed(client, key_prefix)
        client.close()
