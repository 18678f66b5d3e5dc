"""Many clients racing for one lane on the real Redis: the scripts are atomic, so the counts are exact."""
import threading

import pytest
import redis

from capacity.constants import Lane
from capacity.keys import expired_key, hold_field, holds_key, lane_key
from capacity.operations import read_script
from tests.conftest import REDIS_URL

THREADS, ROUNDS, LIMIT, LEASE_MS = 32, 50, 3, 60_000
FAR_FUTURE_MS = 2 ** 50


def run_script(client, script, keys, args):
    """Run a lane script on this thread's own connection.

    Not through get_store().call: a process has one Redis thread whose queue holds 8 jobs, so 32 callers
    would mostly get 'busy' and the race would happen in that queue instead of in Redis.
    """
    return script(keys=keys, args=args, client=client)


@pytest.mark.redis
def test_racing_clients_never_hold_more_leases_than_the_limit(real_redis):
    lane, counter, holds = lane_key(Lane.API_HEAVY), expired_key(), holds_key()
    start = threading.Barrier(THREADS + 1)
    done = threading.Event()
    results = {'taken': 0, 'refused': 0, 'released': 0, 'counts_when_taken': set()}
    results_lock = threading.Lock()
    errors = []
    samples = []

    def racer(n):
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
        acquire = client.register_script(read_script('acquire'))
        release = client.register_script(read_script('release'))
        taken = refused = released = 0
        counts = set()
        try:
            start.wait()
            for i in range(ROUNDS):
                token = f'racer-{n}-{i}'
                args = [token, LEASE_MS, '0', FAR_FUTURE_MS, LIMIT, hold_field(lane)]
                result = run_script(client, acquire, [lane, counter, holds], args)
                if result[0] == 1:
                    taken += 1
                    counts.add(result[2])
                    released += run_script(client, release, [lane, holds], [token, result[1], '1', 0.2, '', 0,
                                                                            hold_field(lane)])
                else:
                    refused += 1
        except Exception as ex:  # noqa: BLE001 - reported by the main thread
            errors.append(ex)
        finally:
            client.close()
            with results_lock:
                results['taken'] += taken
                results['refused'] += refused
                results['released'] += released
                results['counts_when_taken'] |= counts

    def observer():
        client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
        try:
            start.wait()
            while not done.is_set():
                samples.append(client.zcard(lane))
        except Exception as ex:  # noqa: BLE001
            errors.append(ex)
        finally:
            client.close()

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(THREADS)]
    watcher = threading.Thread(target=observer)
    for thread in [*threads, watcher]:
        thread.start()
    try:
        for thread in threads:
            thread.join(60)
    finally:
        done.set()
        watcher.join(10)
    assert not any(thread.is_alive() for thread in [*threads, watcher])
    assert errors == []

    assert results['taken'] + results['refused'] == THREADS * ROUNDS
    assert results['taken'] == results['released']  # every lease taken was released exactly once
    assert results['refused'] > 0, 'no call ever found the lane full: the race never happened'
    assert results['counts_when_taken'] <= {0, 1, 2}
    assert samples and max(samples) <= LIMIT
    assert real_redis.zcard(lane) == 0
    assert real_redis.get(counter) is None  # no lease expired: nothing was pruned
