"""The benchmarks' round-trip counter (api/bench_round_trips.py) against a real Redis: what one round trip is,
and a forked process counting on its own. Run in a child process, since installing it patches redis-py for
the whole process."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REDIS_URL, real_redis_client

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import redis
    from api import bench_round_trips

    directory, url, key = sys.argv[1:]
    bench_round_trips.install(directory)
    client = redis.Redis.from_url(url)
    client.ping()                          # the new connection's handshake, then PING
    counted = bench_round_trips.read(directory)
    client.set(key, 1)
    pipe = client.pipeline(transaction=False)
    pipe.incr(key).incr(key).get(key)
    pipe.execute()                         # three commands, one round trip
    with client.pipeline() as pipe:        # MULTI/EXEC: one round trip
        pipe.incr(key).expire(key, 60).execute()
    client.eval("return redis.call('GET', KEYS[1])", 1, key)
    child = os.fork()
    if child == 0:
        client.connection_pool.reset()     # a forked child gets connections of its own
        client.get(key)
        os._exit(0)
    os.waitpid(child, 0)
    print(json.dumps({'after_ping': counted, 'end': bench_round_trips.read(directory), 'me': os.getpid(),
                      'child': child}))
''')


def test_a_process_counts_each_command_pipeline_and_script_as_one_round_trip_and_a_forked_child_apart(tmp_path):
    key = f'hltest:round-trips:{os.getpid()}'
    real_redis_client()  # skips (or fails in CI) without a Redis
    try:
        output = subprocess.run([sys.executable, '-c', SCRIPT, str(tmp_path), REDIS_URL, key], cwd=ROOT,
                                capture_output=True, text=True, check=True, timeout=60).stdout
    finally:
        real_redis_client().delete(key)
    found = json.loads(output)
    mine = f'{os.getpgid(0)}-{found["me"]}'
    child = next(name for name in found['end'] if name.endswith(f'-{found["child"]}'))
    # A new connection's handshake is a round trip per command (redis-py 8.1: HELLO, CLIENT
    # MAINT_NOTIFICATIONS, two CLIENT SETINFO and SELECT), then the PING.
    handshake = found['after_ping'][mine] - 1
    assert handshake >= 1
    assert found['end'][mine] == handshake + 1 + 4  # then SET, the pipeline, MULTI/EXEC, EVAL
    # The child's own connection: the handshake, then GET; its parent's count stays its own.
    assert found['end'][child] == handshake + 1
    assert len(found['end']) == 2
