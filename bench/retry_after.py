"""Retry-After from measured hold times against the seed's formula, side by side in one run.

    .venv/bin/python bench/retry_after.py [--seconds 120] [--clients 4] [--call-seconds 2]
                                          [--think-seconds 4] [--terminology tiny]

A private stack (bench/stack.py) with one lane worker, es2_knn, whose pool is 2 (es2_knn 3 less the
single-row slot), in enforce mode for every client (enforce_for=all), database connections closed after
each request (DATABASE_CONN_MAX_AGE=0). Every heavy call's work lasts
--call-seconds (HEAVY_LANES_BENCH_CALL_SECONDS, api/bench_views.py), so the es2_knn lane is held by calls of
a known duration; tiers and users get room enough that es2_knn is the only lane that fills.

--clients threads (more than the 2 slots), each a client with one call at a time: a bulk semantic `$match`
of 2 rows no other call shares (so no call is answered by an identical one's work), capacity-aware and
`Prefer: respond-async`, long-polled to its end, then a pause of U(0, --think-seconds) before the next. A
refused call waits exactly the Retry-After it was given (a whole number of seconds) and is sent again with
the same Idempotency-Key, until admitted. Every refusal is recorded with its Retry-After and whether the
call's next send was admitted. A 5xx is not a refusal: it is sent (or polled) again after its Retry-After
and counted apart (the stack's PostgreSQL may be shared and refuse connections).

Two phases of --seconds each, in one run: `measured` (retry_after.measured=1: the lane's mean hold from
the releases, capacity.decisions.retry_after) and `seed` (retry_after.measured=0: 5 s per call ahead).
Before the measured phase, two calls run alone so the lane's hold is measured. Reported per phase: the
mean Retry-After given, the share of refusals whose next send was admitted, how long calls waited for
admission, and calls finished. Writes bench/out/retry_after.json.
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

from helpers import write
from stack import Stack

SLOTS = 2  # es2_knn's pool: es2_knn 3 less reserve_single_row 1
ROOMY = {'staff': 50, 'core': 50, 'early_access': 50, 'preview': 50}
PHASES = (('measured', 1), ('seed', 0))


def post(session, stack, rows, key):
    return session.post(
        f'{stack.url}/concepts/$match/?semantic=true', json={'rows': rows, 'target_repo_url': stack.source},
        headers={'Idempotency-Key': key, 'Prefer': 'respond-async',
                 'X-OCL-Event-Metadata': json.dumps({'capacity_aware': 'true'})}, timeout=30)


def wait_done(session, stack, task, transient):
    """Long-poll `task` to its end; a 5xx (the shared database may refuse a connection) is polled again
    after its Retry-After and counted in `transient`."""
    give_up = time.monotonic() + 120
    state, task_id = task['state'], task['id']
    while state in ('queued', 'running') and time.monotonic() < give_up:
        poll = session.get(f'{stack.url}/tasks/{task_id}/?wait=10', timeout=40)
        if poll.status_code >= 500:
            transient.append(poll.status_code)
            time.sleep(float(poll.headers.get('Retry-After', 1)))
            continue
        state = poll.json()['state']
    return state


def client(number, stack, token, phase, deadline, think, records, lock):
    import requests

    rng = random.Random(f'{phase}-{number}')
    session = requests.Session()
    session.headers['Authorization'] = f'Token {token}'
    calls = 0
    while time.monotonic() < deadline:
        calls += 1
        rows = [{'name': f'chest pain {phase} {number} {calls}'}, {'name': f'fever {phase} {number} {calls}'}]
        key, first_sent = uuid.uuid4().hex, time.monotonic()
        refusal = None
        while True:
            response = post(session, stack, rows, key)
            if response.status_code >= 500:  # not a refusal: the same call again after its Retry-After
                with lock:
                    records['transient'].append(response.status_code)
                time.sleep(float(response.headers.get('Retry-After', 1)))
                continue
            if refusal is not None:
                refusal['next_admitted'] = response.status_code == 202
                with lock:
                    records['refusals'].append(refusal)
                refusal = None
            if response.status_code != 429:
                break
            seconds = int(response.headers['Retry-After'])
            refusal = {'client': number, 'retry_after': seconds, 'scope': response.json().get('scope')}
            time.sleep(seconds)
        if response.status_code != 202:
            with lock:
                records['errors'].append(f'{response.status_code} {response.text[:200]}')
            continue
        admitted = time.monotonic()
        state = wait_done(session, stack, response.json(), records['transient'])
        with lock:
            records['calls'].append({'client': number, 'state': state, 'waited': admitted - first_sent,
                                     'total': time.monotonic() - first_sent})
        time.sleep(rng.uniform(0, think))


def run_phase(stack, phase, measured, args, tokens):
    stack.set_config(retry_after={'measured': measured})
    records = {'refusals': [], 'calls': [], 'errors': [], 'transient': []}
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=client, args=(n, stack, tokens[n % len(tokens)], phase, deadline,
                                                     args.think_seconds, records, lock), daemon=True)
               for n in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.seconds + 180)
    refusals, calls = records['refusals'], records['calls']
    given = [item['retry_after'] for item in refusals]
    return {
        'refusals': len(refusals),
        'mean_retry_after_s': round(statistics.fmean(given), 2) if given else None,
        'retry_after_given': {str(value): given.count(value) for value in sorted(set(given))},
        'admitted_on_first_retry': round(sum(item['next_admitted'] for item in refusals) / len(refusals), 3)
        if refusals else None,
        'calls_finished': len(calls),
        'calls_succeeded': sum(call['state'] == 'succeeded' for call in calls),
        'mean_wait_for_admission_s': mean([call['waited'] for call in calls]),
        'mean_call_total_s': mean([call['total'] for call in calls]),
        'errors': records['errors'][:5],
        'transient_5xx': len(records['transient']),
        'lane_hold_ms': int(stack.redis.hget(hold_key(), 'es2_knn') or 0) or None,
        'run_ms': int(stack.redis.hget(hold_key(), 'run:es2_knn') or 0) or None,
    }


def mean(values):
    return round(statistics.fmean(values), 2) if values else None


def hold_key():
    from capacity.keys import holds_key
    return holds_key()


def warm_up(stack, token):
    """Two calls alone, one after the other, so the lane's hold is measured before the measured phase."""
    import requests
    session = requests.Session()
    session.headers['Authorization'] = f'Token {token}'
    for n in range(2):
        response = post(session, stack, [{'name': f'warm {n}'}, {'name': f'up {n}'}], uuid.uuid4().hex)
        assert response.status_code == 202, response.text
        wait_done(session, stack, response.json(), [])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=120, help='length of each phase')
    parser.add_argument('--clients', type=int, default=4,
                        help=f'clients, each with one call at a time (more than the {SLOTS} slots)')
    parser.add_argument('--call-seconds', type=float, default=2.0, help='how long every call holds its slot')
    parser.add_argument('--think-seconds', type=float, default=4.0, help='pause between calls: U(0, this)')
    parser.add_argument('--api-workers', type=int, default=2)
    parser.add_argument('--terminology', default='tiny', choices=('hpo', 'tiny'))
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    config = {'mode': 'enforce', 'enforce_for': 'all', 'tiers': ROOMY, 'per_user': ROOMY,
              'api_heavy': {'cluster': 8, 'per_task': 64}}
    # Connections closed after each request: this bench times waits of seconds, not requests, and the
    # machine's PostgreSQL may be shared with other stacks (its max_connections is for all of them).
    env = {'HEAVY_LANES_BENCH_CALL_SECONDS': str(args.call_seconds), 'DATABASE_CONN_MAX_AGE': '0'}
    with Stack(api_workers=args.api_workers, lanes={'es2_knn': SLOTS}, terminology=args.terminology,
               config=config, env=env) as stack:
        tokens = [row['token'] for row in stack.tokens()['tokens']]
        warm_up(stack, tokens[0])
        results = {}
        for phase, measured in PHASES:
            results[phase] = run_phase(stack, phase, measured, args, tokens)
            print(f'{phase:>9}: {json.dumps(results[phase])}', flush=True)
            stack.wait_drained(60)
    measured = results['measured']
    report = write('retry_after', {
        'clients': args.clients, 'slots': SLOTS, 'call_seconds': args.call_seconds,
        'think_seconds': args.think_seconds, 'phase_seconds': args.seconds, 'phases': results,
        'targets': {
            'mean_retry_after_s <= call_seconds': (measured['mean_retry_after_s'] or 0) <= args.call_seconds
            and measured['refusals'] > 0,
            'admitted_on_first_retry >= 0.7': (measured['admitted_on_first_retry'] or 0) >= 0.7},
    })
    print(f'{"":>26} {"measured":>9} {"seed":>9}')
    for name in ('refusals', 'mean_retry_after_s', 'admitted_on_first_retry', 'mean_wait_for_admission_s',
                 'mean_call_total_s', 'calls_finished'):
        print(f'{name:>26} {results["measured"][name]!s:>9} {results["seed"][name]!s:>9}')
    print('targets:', report['targets'])


if __name__ == '__main__':
    main()
