"""Shared helpers for the benchmarks: a private Django setup, timing statistics, and result files.

Benchmarks measure a thing and its floor side by side in one run and report ratios, because absolute
times on a shared 2-core machine are noisy. Each script writes its numbers to bench/out/<name>.json.
"""
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / 'bench' / 'out'
sys.path.insert(0, str(ROOT))


def setup_django(redis_url='redis://127.0.0.1:6379/12', prefix='hlbench'):
    """Django on a private SQLite in a temp dir, the lanes on `redis_url` under `prefix`, migrated."""
    var = tempfile.mkdtemp(prefix='heavy-lanes-bench-')
    os.environ.update({'HEAVY_LANES_VAR_DIR': var, 'REDIS_URL': redis_url, 'CAPACITY_KEY_PREFIX': prefix,
                       'DJANGO_SETTINGS_MODULE': 'api.settings', 'CAPACITY_CONFIG_CACHE_SECONDS': '60'})
    import django
    django.setup()
    from django.core.management import call_command
    call_command('migrate', verbosity=0)
    return var


_numbers = itertools.count(1)


def distinct(text):
    """`text` with a number no other call got. Identical calls share one run (workers.sharing: an identical
    call sent while one is open joins it), so a benchmark that measures runs makes every call's body
    distinct, e.g. its first row's name. The process id is part of it: a forked load generator starts from
    its parent's count."""
    return f'{text} {os.getpid()}.{next(_numbers)}'  # next() on a count is atomic: threads get distinct numbers


def stats_us(samples_s):
    """Median, p99 and mean of a list of durations in seconds, as microseconds."""
    ordered = sorted(samples_s)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {'median_us': round(statistics.median(ordered) * 1e6, 1), 'p99_us': round(p99 * 1e6, 1),
            'mean_us': round(statistics.fmean(ordered) * 1e6, 1), 'n': len(ordered)}


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def write(name, data):
    OUT.mkdir(parents=True, exist_ok=True)
    data = {'benchmark': name, 'command': ' '.join([os.path.relpath(sys.executable, ROOT), *sys.argv]),
            'when': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), **data}
    (OUT / f'{name}.json').write_text(json.dumps(data, indent=2) + '\n')
    return data


def lane_limit(key, tag, config, user_tier):
    """The configured limit of the lane whose Redis key is `key` (`tag` is its `{prefix}:`), or None.

    `user_tier` maps a user id (as in the key) to its tier; an unknown user counts as preview.
    """
    lane, _, part = key[len(tag):].partition(':')
    if lane == 'api_heavy':
        return config.api_heavy.cluster
    if lane == 'api_heavy_task':
        return config.api_heavy.per_task
    if lane == 'es2_knn':
        return config.es2_knn
    if lane == 'tier':
        return config.tiers[part]
    if lane == 'user':
        return config.per_user[user_tier.get(part, 'preview')]
    return None


def lane_limits(pools):
    """Config changes that give the lane pools the sizes asked for ({queue: n}), with room elsewhere.

    interactive = reserve_single_row, es2_knn = es2_knn - reserve, api_heavy = api_heavy.cluster - reserve.
    """
    reserve = pools.get('interactive') or 1
    changes = {'reserve_single_row': reserve}
    if 'es2_knn' in pools and pools['es2_knn'] is not None:
        changes['es2_knn'] = reserve + pools['es2_knn']
    if 'api_heavy' in pools and pools['api_heavy'] is not None:
        changes['api_heavy'] = {'cluster': reserve + pools['api_heavy']}
    return changes


def wait_state(call_id, states, timeout=60, interval=0.002):
    """Poll the call's rows until its state (what its owner sees) is one of `states`; return it (or the last
    seen at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        state = call_rows([call_id]).get(call_id, {}).get('state')
        if state in states or time.monotonic() > deadline:
            return state
        time.sleep(interval)


def call_rows(ids=None):
    """{call id: row} of the calls `ids` (or all): what each call's owner sees (workers.lifecycle.seen: state,
    started_at, finished_at, error), its own fields and its work's (queue, worker, attempts, lease_lost)."""
    from workers.lifecycle import seen
    from workers.models import Call
    calls = Call.objects.select_related('work')
    if ids is not None:
        calls = calls.filter(pk__in=list(ids))
    rows = {}
    for call in calls:
        now = seen(call, call.work)
        rows[call.pk] = {
            'id': call.pk, 'state': now.state, 'started_at': now.started_at, 'finished_at': now.finished_at,
            'error': now.error or '', 'created_at': call.created_at, 'served_as': call.served_as,
            'idempotency_key': call.idempotency_key, 'rows': call.rows, 'work_id': call.work_id,
            'queue': call.work.queue, 'worker': call.work.worker, 'attempts': call.work.attempts,
            'lease_lost': call.work.lease_lost}
    return rows


def drive(stack, token, bodies, clients, interval=0.01):
    """Send `bodies` in order from `clients` threads, one `$match` call in flight each (respond-async, then
    watching its row every `interval` s until it ends, rather than long-polling: a long poll holds an API
    thread, and the API, not the lane, would set the pace); return the call ids. Raises when any call
    didn't succeed."""
    import threading

    import requests
    from django.db import connection

    pending = list(reversed(bodies))
    lock = threading.Lock()
    ids, failures = [], []

    def client():
        session = requests.Session()
        session.headers['Authorization'] = f'Token {token}'
        try:
            while True:
                with lock:
                    if not pending:
                        return
                    body = pending.pop()
                response = session.post(f'{stack.url}/concepts/$match/?semantic=true', json=body,
                                        headers={'Prefer': 'respond-async'}, timeout=60)
                if response.status_code != 202:
                    failures.append(response.text[:200])
                    continue
                call_id = response.json()['id']
                state = wait_state(call_id, ('succeeded', 'failed', 'cancelled', 'expired'), timeout=120,
                                   interval=interval)
                with lock:
                    ids.append(call_id)
                if state != 'succeeded':
                    failures.append(f'{call_id}: {state}')
        finally:
            connection.close()  # this thread's own database connection

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f'{len(failures)} calls failed: {failures[:3]}')
    return ids
