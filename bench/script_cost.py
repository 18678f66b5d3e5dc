"""Script cost: the Redis commands the limiter's Lua scripts run for one waited single-row call's life, by
`INFO commandstats` (script-internal commands included), on a private redis-server of its own.

    .venv/bin/python bench/script_cost.py [--calls 200] [--redis-server redis-server]

One call's life, through the real operations (capacity.store.LaneStore -> capacity.operations): acquire of
its 4 lanes (api_heavy, es2_knn, tier, user) for the queued lease, the API host's waiting slot (acquire and
release of 1 lane), the worker's renewal of the 4 lanes as it starts the run (the running lease), and the
release of the 4 lanes with the run measured. Calls run one after another, so it is the admitted path's
cost, in two settings: `quiet`, every lane empty between calls (so each acquire makes its keys), and
`busy`, another call's lease in the shared lanes (api_heavy, es2_knn, tier), as on a loaded stack where
those keys live on. It prints the commands per call by name and in all. Counts, not timings: the
machine's load doesn't change them.
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'api.settings')


LEASE_MS = 60_000  # lease_seconds' default: the waiting slot's and a running call's lease
QUEUED_LEASE_MS = 90_000  # what the API acquires for: lease_seconds + one sweep (lifecycle.queued_lease_ms)


def free_port():
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def commandstats(client):
    return {name.removeprefix('cmdstat_'): stats['calls'] for name, stats in client.info('commandstats').items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--redis-server', default='redis-server')
    options = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen([options.redis_server, '--port', str(port), '--save', '', '--appendonly', 'no',
                                   '--dir', workdir], stdout=subprocess.DEVNULL)
        try:
            run(port, options.calls)
        finally:
            server.terminate()
            server.wait()


def run(port, calls):
    import django
    import redis

    django.setup()
    from capacity.constants import Lane
    from capacity.keys import lane_key
    from capacity.store import LaneStore

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    store = LaneStore(client)
    lanes = [lane_key(Lane.API_HEAVY), lane_key(Lane.ES2_KNN), lane_key(Lane.TIER, 'free'),
             lane_key(Lane.USER, 42)]
    limits = [100, 20, 50, 5]
    slot = [lane_key(Lane.API_HEAVY_TASK, 'host-1')]

    def one_call(n):
        token = f'call-{n}'
        acquired = store.acquire(lanes, limits, token, QUEUED_LEASE_MS, False)
        assert acquired.taken, acquired
        waiting = store.acquire(slot, [8], f'wait-{n}', LEASE_MS, False)
        assert waiting.taken, waiting
        time.sleep(0.002)  # a renewal comes renew_seconds after the acquire, never in the same ms
        assert store.renew(lanes, token, LEASE_MS) == len(lanes)  # the worker's, as it starts the run
        assert store.release(slot, f'wait-{n}', waiting.acquired_ms) == 1
        assert store.release(lanes, token, acquired.acquired_ms, ran=(Lane.ES2_KNN, 25)) == len(lanes)

    for setting in ('quiet', 'busy'):
        if setting == 'busy':  # another call's lease in each shared lane, for the whole run
            assert store.acquire(lanes[:3], limits[:3], 'other', QUEUED_LEASE_MS, False).taken
        for n in range(5):  # warm: scripts loaded, means exist, as on a running stack
            one_call(f'warm-{setting}-{n}')
        client.config_resetstat()
        for n in range(calls):
            one_call(f'{setting}-{n}')
        stats = commandstats(client)
        stats.pop('config|resetstat', None)
        stats.pop('info', None)
        per_call = {name: count / calls for name, count in sorted(stats.items(), key=lambda item: (-item[1],
                                                                                                    item[0]))}
        print(f'{setting}: commands per call ({calls} calls, script-internal included)')
        for name, count in per_call.items():
            print(f'  {name:20} {count:6.2f}')
        print(f'  {"total":20} {sum(per_call.values()):6.2f}')

if __name__ == '__main__':
    main()
