"""Saturation: enforce mode with 4x more clients than the lane limits allow, for 60 s. In-flight leases are
sampled every 50 ms straight from the lane sorted sets; the run checks that no sample exceeds a lane's
limit, every refusal carries a Retry-After, every admitted call finishes, and no lease is left after.

    .venv/bin/python bench/saturation.py [--seconds 60] [--clients-factor 4] [--backoff-cap 1.0]
                                         [--plot docs/img/saturation.png]

A private stack (bench/stack.py) with one worker per lane queue (pools from the default config:
interactive 1, es2_knn 2, api_heavy 3), mode enforce for every client (enforce_for=all) and the default
limits (api_heavy 4 per cluster and 2 per API host for calls that wait, es2_knn 3, one slot reserved for
single-row calls, tiers 4/4/3/2, per user 4/3/2/1). Clients = factor x api_heavy.cluster threads, taking the
four demo users in turn, each with one call at a time, in the load generator's mix (weights
single 5, bulk 3, bulk-rerank 1, rerank 1): `single` is a one-row semantic `$match` sent as an old client
would (`Prefer: wait=5`, so it also takes the API host's lane); the others are capacity-aware
(`X-OCL-Event-Metadata: {"capacity_aware": "true"}`, `Prefer: respond-async`) bulk calls of 10 rows, then
long-poll their task. Each call's first row (or `q`) carries a number, so no two calls are identical work
(they would share one run, taking no lease). A refused client waits min(Retry-After, --backoff-cap) s
(x U(0.5, 1)) before its next call, to keep the pressure at the factor asked for (a well-behaved client
waits the whole Retry-After).

The sampler reads, every 50 ms with one pipeline, ZCOUNT <lane> (now, +inf) of every lane key (now from
Redis TIME, the clock the scripts score leases by); the key list is refreshed with SCAN every second.
After the run the clients' calls drain (each long-polls to its end), then every lane must hold no lease.
"""
import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

from helpers import ROOT, distinct, lane_limit, write
from stack import Stack

SAMPLE_SECONDS = 0.05
MIX = (('single', 5), ('bulk', 3), ('bulk-rerank', 1), ('rerank', 1))
BULK_ROWS = 10


class Sampler(threading.Thread):
    """ZCOUNT of every lane key over unexpired scores, every 50 ms, from the private Redis."""

    def __init__(self, stack, limit_of, known_keys=()):
        super().__init__(name='lane-sampler', daemon=True)
        self.stack = stack
        self.known_keys = list(known_keys)  # sampled from the start, before any call created them
        self.error = None
        self.limit_of = limit_of
        self.stop_event = threading.Event()
        self.samples = []  # (seconds since start, {key: count})
        self.max = Counter()
        self.violations = []
        self.depth_max = Counter()

    def run(self):
        try:
            self.sample()
        except Exception as ex:  # noqa: BLE001 - reported as a failed check, never a hung run
            self.error = f'{type(ex).__name__}: {ex}'

    def sample(self):
        client = self.stack.redis
        keys, keys_at = list(self.known_keys), 0.0
        started = time.monotonic()
        next_at = started
        while not self.stop_event.is_set():
            now = time.monotonic()
            if now - keys_at >= 1.0:
                keys, keys_at = sorted(set(self.known_keys) | set(self.stack.lane_keys())), now
            # ZCOUNT needs Redis's "now": read TIME first, then count every lane in one pipeline.
            seconds, micros = client.time()
            now_ms = seconds * 1000 + micros // 1000
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.zcount(key, f'({now_ms}', '+inf')
            counts = dict(zip(keys, pipe.execute())) if keys else {}
            depths = self.stack.queue_depths()
            elapsed = time.monotonic() - started
            self.samples.append((round(elapsed, 3), counts, depths))
            for key, count in counts.items():
                self.max[key] = max(self.max[key], count)
                limit = self.limit_of(key)
                if limit is not None and count > limit:
                    self.violations.append({'t': round(elapsed, 3), 'key': key, 'count': count, 'limit': limit})
            for queue, depth in depths.items():
                self.depth_max[queue] = max(self.depth_max[queue], depth)
            next_at += SAMPLE_SECONDS
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def stop(self):
        self.stop_event.set()
        self.join()


def call_request(kind, source, rows):
    """(path, body, headers) of one call of `kind`."""
    aware = {'X-OCL-Event-Metadata': json.dumps({'capacity_aware': 'true'}), 'Prefer': 'respond-async'}
    if kind == 'single':
        return ('/concepts/$match/?semantic=true', {'rows': [{'name': rows[0]}], 'target_repo_url': source},
                {'Prefer': 'wait=5'})
    if kind == 'bulk':
        return ('/concepts/$match/?semantic=true',
                {'rows': [{'name': name} for name in rows], 'target_repo_url': source}, aware)
    if kind == 'bulk-rerank':
        return ('/concepts/$match/?reranker=true',
                {'rows': [{'name': name} for name in rows], 'target_repo_url': source}, aware)
    return ('/concepts/$rerank/', {'q': rows[0], 'rows': [{'name': name} for name in rows[1:]]}, aware)


def client_loop(number, stack, token, deadline, backoff_cap, ledger, lock):
    import requests

    from heavy_lanes_client.phrases import PHRASES

    rng = random.Random(number)
    session = requests.Session()
    session.headers['Authorization'] = f'Token {token}'
    kinds, weights = zip(*MIX)
    while time.monotonic() < deadline:
        kind = rng.choices(kinds, weights)[0]
        rows = rng.sample(PHRASES, BULK_ROWS + 1)
        rows[0] = distinct(rows[0])  # no two calls are identical work (they would share one run)
        path, body, headers = call_request(kind, stack.source, rows)
        entry = {'client': number, 'kind': kind, 'sent': time.monotonic()}
        try:
            response = session.post(f'{stack.url}{path}', json=body, timeout=30,
                                    headers={**headers, 'Idempotency-Key': uuid.uuid4().hex})
        except requests.RequestException as ex:
            entry.update(outcome='error', detail=str(ex)[:200])
            with lock:
                ledger.append(entry)
            continue
        entry['status'] = response.status_code
        entry['decision'] = response.headers.get('X-OCL-Capacity-Decision')
        if response.status_code == 429:
            payload = response.json()
            header = response.headers.get('Retry-After')
            entry.update(outcome='refused', retry_after=header, error_code=payload.get('error_code'),
                         body_retry_after=payload.get('retry_after'), scope=payload.get('scope'))
            with lock:
                ledger.append(entry)
            wait = min(float(header) if header and header.isdigit() else backoff_cap, backoff_cap)
            time.sleep(wait * rng.uniform(0.5, 1.0))
            continue
        if response.status_code not in (200, 202):
            entry.update(outcome='error', detail=response.text[:200])
            with lock:
                ledger.append(entry)
            continue
        if response.status_code == 200:
            # Waited for and answered as the in-request endpoint is: the result itself; Content-Location names
            # the call's handle (/tasks/<id>/).
            entry.update(id=response.headers.get('Content-Location', '').rstrip('/').rsplit('/', 1)[-1],
                         outcome='succeeded', finished=time.monotonic())
            with lock:
                ledger.append(entry)
            continue
        task = response.json()
        entry['id'] = task['id']
        # A long poll answers at once when this API host's waiting slots are taken: then its Retry-After
        # hint says when to look again. Give up only after the queue deadline, far beyond the run.
        give_up = time.monotonic() + 600
        while task['state'] in ('queued', 'running') and time.monotonic() < give_up:
            asked = time.monotonic()
            poll = session.get(f'{stack.url}/tasks/{task["id"]}/?wait=10', timeout=40)
            task = poll.json()
            hint = poll.headers.get('Retry-After')
            if task['state'] in ('queued', 'running') and time.monotonic() - asked < 1 and hint:
                time.sleep(min(float(hint), 2.0))
        entry.update(outcome=task['state'], finished=time.monotonic())
        with lock:
            ledger.append(entry)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--clients-factor', type=int, default=4)
    parser.add_argument('--backoff-cap', type=float, default=1.0, help='longest wait after a 429, seconds')
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--terminology', default='hpo', choices=('hpo', 'tiny'))
    parser.add_argument('--plot', default=str(ROOT / 'docs' / 'img' / 'saturation.png'),
                        help='PNG of in-flight per lane over time ("" for none; needs matplotlib)')
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)

    with Stack(api_workers=args.api_workers, terminology=args.terminology,
               config={'mode': 'enforce', 'enforce_for': 'all'}) as stack:
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from capacity.config import get_config

        config = get_config()
        tokens = stack.tokens()['tokens']
        user_tier = {str(get_user_model().objects.get(username=row['username']).pk): row['tier'] for row in tokens}
        tag = '{' + settings.CAPACITY_KEY_PREFIX + '}:'

        def limit_of(key):
            return lane_limit(key, tag, config, user_tier)

        clients = args.clients_factor * config.api_heavy.cluster
        # Warm every pool process (each loads the indexes once) before the clock starts.
        warm = [threading.Thread(target=client_loop, args=(i, stack, tokens[i % 4]['token'], time.monotonic() + 3,
                                                           0.5, [], threading.Lock())) for i in range(4)]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        stack.wait_drained()
        stack.reset_calls(purge=False)

        ledger, lock = [], threading.Lock()
        known = [tag + lane for lane in ('api_heavy', 'es2_knn', f'api_heavy_task:{settings.CAPACITY_TASK_ID}')]
        known += [f'{tag}tier:{tier}' for tier in config.tiers.names()] + [f'{tag}user:{pk}' for pk in user_tier]
        sampler = Sampler(stack, limit_of, known)
        sampler.start()
        started = time.monotonic()
        deadline = started + args.seconds
        threads = [threading.Thread(target=client_loop, args=(i, stack, tokens[i % len(tokens)]['token'], deadline,
                                                              args.backoff_cap, ledger, lock), daemon=True)
                   for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=max(1.0, deadline - time.monotonic()) + 300)
        drained_at = time.monotonic()
        time.sleep(0.5)
        sampler.stop()
        leftover_cards = {key: stack.redis.zcard(key) for key in stack.lane_keys()}
        leftover = {key: n for key, n in leftover_cards.items() if n}
        unexpired = {key: n for key, n in stack.in_flight().items() if n}
        depths = stack.queue_depths()
        from helpers import call_rows
        states = Counter(row['state'] for row in call_rows().values())
        served_as = stack.served_as()

    outcomes = Counter(entry['outcome'] for entry in ledger)
    refused = [entry for entry in ledger if entry['outcome'] == 'refused']
    bad_refusals = [entry for entry in refused if not (entry.get('retry_after') or '').isdigit()
                    or int(entry['retry_after']) < 1 or entry.get('error_code') != 'capacity_exceeded'
                    or str(entry.get('body_retry_after')) != entry.get('retry_after')]
    admitted = [entry for entry in ledger if entry['outcome'] not in ('refused', 'error')]
    unfinished = [entry for entry in admitted if entry['outcome'] != 'succeeded']
    gaps = [b[0] - a[0] for a, b in zip(sampler.samples, sampler.samples[1:])]
    maxima = {key[len(tag):]: {'max': count, 'limit': limit_of(key)} for key, count in sorted(sampler.max.items())}
    checks = {
        'in_flight_within_limits': not sampler.violations and not sampler.error,
        'every_refusal_has_retry_after': not bad_refusals,
        'every_admitted_call_finished': not unfinished and not outcomes.get('error'),
        'no_lease_left': not leftover and not unexpired,
        'queues_empty': not any(depths.values()),
    }
    print(f'{clients} clients for {args.seconds:.0f} s (drained {drained_at - deadline:.1f} s after): '
          f'{len(ledger)} calls, {len(admitted)} admitted, {len(refused)} refused, outcomes {dict(outcomes)}')
    print(f'samples: {len(sampler.samples)}, interval median {statistics.median(gaps) * 1000:.1f} ms, '
          f'max {max(gaps) * 1000:.1f} ms')
    for lane, line in maxima.items():
        print(f'  {lane:<22} max in flight {line["max"]:>3} / limit {line["limit"]}')
    retry_values = Counter(entry.get('retry_after') for entry in refused)
    print(f'Retry-After values on refusals: {dict(sorted(retry_values.items(), key=lambda kv: str(kv[0])))}; '
          f'refusals by scope: {dict(Counter(entry.get("scope") for entry in refused))}')
    print(f'call rows by state: {dict(states)}, by how they were served: {served_as}; leases left: '
          f'{leftover or 0}; queue depths: {depths}')
    for name, ok in checks.items():
        print(f'  {"PASS" if ok else "FAIL"} {name}')
    if sampler.error:
        print(f'  the sampler failed: {sampler.error}')
    if sampler.violations:
        print(f'  violations: {sampler.violations[:5]}')
    if args.plot:
        plot(args.plot, sampler.samples, tag, limit_of, clients, args.seconds)
    latencies = sorted(entry['finished'] - entry['sent'] for entry in admitted if entry.get('finished'))
    write('saturation', {
        'clients': clients, 'seconds': args.seconds, 'backoff_cap': args.backoff_cap,
        'calls': len(ledger), 'admitted': len(admitted), 'refused': len(refused), 'outcomes': dict(outcomes),
        'by_kind': {kind: dict(Counter(e['outcome'] for e in ledger if e['kind'] == kind)) for kind, _ in MIX},
        'retry_after_values': {str(k): v for k, v in retry_values.items()},
        'latency_s': {'median': round(statistics.median(latencies), 2) if latencies else None,
                      'max': round(latencies[-1], 2) if latencies else None},
        'samples': len(sampler.samples), 'sample_interval_ms': {
            'median': round(statistics.median(gaps) * 1000, 1), 'max': round(max(gaps) * 1000, 1)},
        'max_in_flight': maxima, 'violations': sampler.violations[:20], 'leases_left': leftover,
        'call_states': dict(states), 'served_as': served_as, 'checks': checks, 'plot': args.plot or None,
    })
    sys.exit(0 if all(checks.values()) else 1)


def plot(path, samples, tag, limit_of, clients, seconds):
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: no plot')
        return
    series = defaultdict(list)
    lanes = ('api_heavy', 'es2_knn', 'tier:core', 'tier:preview')
    times = [t for t, _, _ in samples]
    for _, counts, _ in samples:
        for lane in lanes:
            series[lane].append(counts.get(tag + lane, 0))
        task = [n for key, n in counts.items() if key.startswith(tag + 'api_heavy_task:')]
        series['api_heavy_task (host)'].append(sum(task))
    figure, axes = plt.subplots(len(series), 1, figsize=(9, 1.6 * len(series)), sharex=True)
    for axis, (lane, values) in zip(axes, series.items()):
        axis.step(times, values, where='post', linewidth=0.8)
        key = tag + (lane if not lane.startswith('api_heavy_task') else 'api_heavy_task:x')
        limit = limit_of(key)
        if limit is not None:
            axis.axhline(limit, color='red', linestyle='--', linewidth=0.8, label=f'limit {limit}')
            axis.legend(loc='upper right', fontsize=7)
            axis.set_ylim(0, limit + 1.5)
        axis.set_ylabel(lane, rotation=0, ha='right', fontsize=8)
    axes[-1].set_xlabel('seconds')
    figure.suptitle(f'In-flight leases sampled every 50 ms: {clients} clients, enforce, {seconds:.0f} s', fontsize=10)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    print(f'plot: {os.path.relpath(path, ROOT)}')


if __name__ == '__main__':
    main()
