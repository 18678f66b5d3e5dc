"""Shared work: what an identical call costs when it joins an open call or meets a warm result, against a
call that runs its own work, and what repeated work does to a lane's throughput, side by side in one run.

    .venv/bin/python bench/sharing.py [--reps 60] [--rows 50] [--calls 40] [--clients 4] [--rounds 2]

A private stack (bench/stack.py): gunicorn (3 gthread workers) and one `es2_knn` lane worker with a pool of
one process, mode shadow (every call admitted), warm results on (`cache.ttl_seconds` 300, the default;
the other benchmarks turn them off). Every call is a semantic `$match` of `--rows` lay phrases whose first
row carries a number (helpers.distinct), so a call is identical to another only when the script means it.

1. Time to result, one user, `Prefer: wait=30` (the answer is the result): per repeat, in an order that
   alternates,
   - `cold`: a new body, nothing else running: the call runs its own work;
   - `warm`: the same body again once that call succeeded: answered from its result (served_as `cached`);
   - `coalesced`: a leader with another new body is sent with `Prefer: respond-async`; once its row is
     `running`, an identical call is sent and timed: it joins the leader (served_as `coalesced`) and ends
     with it. Its time is from its own send, so it saves the leader's queue wait and part of its run.
   Each sample is kept only when its row was served as intended (the counts of the others are reported);
   p50 and p99 of each kind, and their ratios to cold.
2. Throughput of the lane, `--clients` threads with one call in flight each (`Prefer: respond-async`, then
   watching the call's row), `--calls` calls per run: `distinct` (every body new) against `half` (every other
   call repeats a body sent two calls before it, so it joins that call while open or meets its result);
   the two alternate for `--rounds` rounds, medians. Calls finished per second = calls / (last finish -
   first submit); work runs = the calls served as `run` (what the lane's pool ran).
"""
import argparse
import os
import statistics
import sys
import time
from collections import Counter

from helpers import distinct, drive, wait_state, write
from stack import Stack

from heavy_lanes_client.phrases import PHRASES

QUEUE = 'es2_knn'
TTL_SECONDS = 300
WAIT_SECONDS = 30
REPEAT_AFTER = 2  # in a `half` run, a repeat follows its original after this many new bodies
KINDS = ('cold', 'coalesced', 'warm')


def body_of(source, rows, number):
    """A `$match` body of `rows` phrases starting at `number`, its first row's name numbered (distinct)."""
    names = [PHRASES[(number * rows + i) % len(PHRASES)] for i in range(rows)]
    names[0] = distinct(names[0])
    return {'rows': [{'name': name} for name in names], 'target_repo_url': source, 'limit': 5}


def stats_ms(samples):
    ordered = sorted(samples)
    if not ordered:
        return None
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {'p50_ms': round(statistics.median(ordered) * 1000, 2), 'p99_ms': round(p99 * 1000, 2),
            'mean_ms': round(statistics.fmean(ordered) * 1000, 2), 'n': len(ordered)}


def call_id_of(response):
    """The call's id: a waited answer names its handle in Content-Location, a handle carries it."""
    if response.status_code == 200:
        return response.headers['Content-Location'].rstrip('/').rsplit('/', 1)[-1]
    return response.json()['id']


def latencies(stack, session, url, reps, rows):
    """Time to result of cold, coalesced and warm calls: ({kind: [seconds]}, {kind: [seconds from the work's
    end, its row's finished_at, to the answer]}, {kind: Counter(served_as)}, whether every warm answer
    equalled its cold one)."""
    from helpers import call_rows

    samples = {kind: [] for kind in KINDS}
    tails = {kind: [] for kind in KINDS if kind != 'warm'}
    served = {kind: Counter() for kind in KINDS}
    same = True
    number = 0

    def timed(body, kind):
        started = time.perf_counter()
        response = session.post(url, json=body, headers={'Prefer': f'wait={WAIT_SECONDS}'}, timeout=60)
        elapsed = time.perf_counter() - started
        answered = time.time()
        assert response.status_code == 200, response.text[:300]
        call_id = call_id_of(response)
        row = call_rows([call_id])[call_id]
        served_as, finished_at = row['served_as'], row['finished_at']
        served[kind][served_as] += 1
        if served_as == {'cold': 'run', 'coalesced': 'coalesced', 'warm': 'cached'}[kind]:
            samples[kind].append(elapsed)
            if kind in tails:  # a joined call's finished_at is its work's
                tails[kind].append(answered - finished_at.timestamp())
        return response.json()

    def cold_then_warm():
        nonlocal same
        body = body_of(stack.source, rows, number)
        first = timed(body, 'cold')
        again = timed(body, 'warm')
        same = same and first == again

    def coalesced():
        body = body_of(stack.source, rows, number + 1)
        response = session.post(url, json=body, headers={'Prefer': 'respond-async'}, timeout=60)
        assert response.status_code == 202, response.text[:300]
        leader = response.json()['id']
        if wait_state(leader, ('running', 'succeeded', 'failed')) == 'running':
            timed(body, 'coalesced')
        else:
            served['coalesced']['missed: the leader ended before it was seen running'] += 1
        wait_state(leader, ('succeeded', 'failed', 'cancelled', 'expired'))

    for rep in range(reps):
        for step in ((cold_then_warm, coalesced) if rep % 2 == 0 else (coalesced, cold_then_warm)):
            step()
        number += 2
    return samples, tails, {kind: dict(counts) for kind, counts in served.items()}, same


def bulk_bodies(source, rows, calls, kind, start):
    """The bodies of one throughput run, in sending order. `distinct`: every one new; `half`: new bodies,
    each repeated once, REPEAT_AFTER new bodies later."""
    if kind == 'distinct':
        return [body_of(source, rows, start + i) for i in range(calls)]
    new = [body_of(source, rows, start + i) for i in range(calls // 2)]
    order = []
    for i, body in enumerate(new):
        order.append(body)
        if i >= REPEAT_AFTER:
            order.append(new[i - REPEAT_AFTER])
    order += new[len(new) - REPEAT_AFTER:]
    return order



def throughput(ids):
    from helpers import call_rows
    calls = list(call_rows(ids).values())
    wall = (max(call['finished_at'] for call in calls) - min(call['created_at'] for call in calls)).total_seconds()
    served = Counter(call['served_as'] for call in calls)
    return {'calls': len(calls), 'wall_seconds': round(wall, 3), 'calls_per_s': round(len(calls) / wall, 2),
            'work_runs': served.get('run', 0), 'served_as': dict(served)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--reps', type=int, default=60, help='repeats of each latency kind')
    parser.add_argument('--rows', type=int, default=50, help='rows per call')
    parser.add_argument('--calls', type=int, default=40, help='calls per throughput run')
    parser.add_argument('--clients', type=int, default=4, help='client threads in a throughput run')
    parser.add_argument('--rounds', type=int, default=2, help='rounds of the two throughput runs, alternating')
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--terminology', default='hpo', choices=('hpo', 'tiny'))
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)

    import requests

    config = {'mode': 'shadow', 'cache': {'ttl_seconds': TTL_SECONDS}}
    with Stack(api_workers=args.api_workers, lanes={QUEUE: 1}, terminology=args.terminology,
               config=config) as stack:
        token = stack.token('core')
        session = requests.Session()
        session.headers['Authorization'] = f'Token {token}'
        url = f'{stack.url}/concepts/$match/?semantic=true'
        # Warm: the pool process loads the indexes, the API's processes their connections.
        drive(stack, token, [body_of(stack.source, 2, i) for i in range(8)], args.clients)
        stack.reset_calls(purge=False)

        samples, tails, served, same = latencies(stack, session, url, args.reps, args.rows)
        stack.reset_calls(purge=False)
        rounds = {'distinct': [], 'half': []}
        start = 1000
        for round_number in range(args.rounds):
            for kind in (('distinct', 'half') if round_number % 2 == 0 else ('half', 'distinct')):
                ids = drive(stack, token, bulk_bodies(stack.source, args.rows, args.calls, kind, start),
                            args.clients)
                start += args.calls
                line = throughput(ids)
                rounds[kind].append(line)
                print(f'round {round_number + 1} {kind:>8}: {line["calls_per_s"]} calls/s ({line["calls"]} calls, '
                      f'{line["wall_seconds"]} s), {line["work_runs"]} work runs; served_as {line["served_as"]}',
                      flush=True)
                stack.reset_calls(purge=False)

    summary = {kind: stats_ms(values) for kind, values in samples.items()}
    after_end = {kind: stats_ms(values) for kind, values in tails.items()}
    cold = summary['cold']
    ratios = {f'{kind}_vs_cold_p50': round(summary[kind]['p50_ms'] / cold['p50_ms'], 3)
              for kind in ('coalesced', 'warm') if summary[kind] and cold}
    bulk = {kind: {'calls_per_s': statistics.median(line['calls_per_s'] for line in lines),
                   'work_runs': statistics.median(line['work_runs'] for line in lines),
                   'calls': lines[0]['calls'], 'rounds': lines} for kind, lines in rounds.items()}
    bulk_ratio = round(bulk['half']['calls_per_s'] / bulk['distinct']['calls_per_s'], 2)
    for kind in KINDS:
        line = summary[kind]
        if line:
            print(f'{kind:>9}: p50 {line["p50_ms"]:8.2f} ms  p99 {line["p99_ms"]:8.2f} ms  ({line["n"]} samples; '
                  f'served_as {served[kind]})')
        else:
            print(f'{kind:>9}: no sample served as intended; served_as {served[kind]}')
    print('from the work\'s end to the answer: ' + ', '.join(
        f'{kind} p50 {line["p50_ms"]} ms, p99 {line["p99_ms"]} ms' for kind, line in after_end.items() if line))
    print(f'time to result vs cold (p50): {ratios}; every warm answer equal to its cold one: {same}')
    for kind, line in bulk.items():
        print(f'{kind:>9} bulk: {line["calls_per_s"]} calls/s, {line["work_runs"]} work runs of '
              f'{line["calls"]} calls (median of {args.rounds})')
    print(f'half repeated / all distinct, calls/s: x{bulk_ratio}')
    write('sharing', {'reps': args.reps, 'rows_per_call': args.rows, 'calls': args.calls, 'clients': args.clients,
                      'rounds': args.rounds, 'ttl_seconds': TTL_SECONDS, 'latency': summary, 'served_as': served,
                      'work_end_to_answer': after_end,
                      'ratios': ratios, 'same_results': same, 'bulk': bulk, 'bulk_half_vs_distinct': bulk_ratio,
                      'samples_ms': {kind: [round(v * 1000, 2) for v in values] for kind, values in samples.items()}})


if __name__ == '__main__':
    main()
