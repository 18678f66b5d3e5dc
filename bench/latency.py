"""Time to a final state under the load generator's default mix, and a generic client's bulk run (issue 15).

    .venv/bin/python bench/latency.py [--seconds 20] [--users 8] [--generic-users 4] [--batches 10]
                                      [--rows 20] [--terminology hpo] [--api-workers 3]

A private stack (bench/stack.py): gunicorn with --api-workers processes, one lane worker per queue, pools
from the default capacity config (interactive 1, es2_knn 2, api_heavy 3), warm results off, serving the
terminology `make run` loads (HPO), which is the stack the load generator meets from a fresh clone.
`--terminology tiny` makes every call 3-5 times shorter: a stricter test of the bulk bound, which is
relative to the calls' own queue wait and run, against the fixed HTTP hops around them.

Part 1, `mix-poll` and `mix-wait`: `heavy_lanes_client.load.LoadGenerator` with its default mix (single 5,
bulk 3, bulk-rerank 1, rerank 1), --users users taking the four demo tokens in turn, for --seconds, in the
default mode (shadow); twice, side by side: the users' POSTs answer a handle at once and they long-poll it
(`poll`, the client before issue 15's last change), then the POST itself waits up to the long poll
(`wait`: `Prefer: respond-async, wait=10`, LoadPlan.submit_wait, the client's default now).
Each call's time from its first send to its final state is the client's; its queue wait (created →
started) and run time (started → finished) are its row's. Targets (issue 15): single-row calls' p99 ≤ 2 × the
p99 of their run time + 100 ms; bulk calls' p99 ≤ 1.5 × the p99 of their queue wait + run time.

Part 2, `generic`: a second stack with one lane worker, es2_knn with a pool of 2, whose calls each hold
their slot --call-seconds (HEAVY_LANES_BENCH_CALL_SECONDS, api/bench_views.py); enforce mode for every
client, so with more clients than slots bulk calls are refused; and --generic-users clients that know
nothing of Heavy Lanes' own headers. Each sends --batches bulk semantic
`$match` calls of --rows rows (names no other call shares), one at a time, with an Idempotency-Key, no
`Prefer` and no `X-OCL-Event-Metadata` — as an OCL client does — and reads only the standard fields:
`RateLimit-Policy` / `RateLimit` (parsed with `http_sf`, a general RFC 9651 parser, not this project's
client), `Retry-After`, and on a 202 the handle in `Location`. Before a send it waits the reset `t` of a
concurrency quota whose last `RateLimit` said no room was left (`r=0`); after a 429 or 503 it waits the
Retry-After and sends again with the same key; a 202 is polled at its `Location` after each Retry-After.
Checked: every batch ends 200 with one result per row, no call row left unfinished, no lease left.

Writes bench/out/latency.json.
"""
import argparse
import json
import os
import sys
import threading
import time
import uuid

import requests
from helpers import write
from stack import Stack

GENERIC_CONFIG = {'mode': 'enforce', 'enforce_for': 'all'}  # es2_knn holds 2 bulk calls: 3 less the reserve



def handoff_gaps(rows):
    """Seconds a pool process spent between one call's end and the start of the next, where the next was
    already waiting when the first ended: the worker's own time per call (ack, fetch, claim) that a
    queue behind one process pays on every call. Grouped by process (`worker` names the pid)."""
    by_process = {}
    for row in rows:
        if row.get('served_as') == 'run' and row.get('worker') and row.get('started_at') and row.get('finished_at'):
            by_process.setdefault(row['worker'], []).append(row)
    gaps = []
    for runs in by_process.values():
        runs.sort(key=lambda row: row['started_at'])
        for before, after in zip(runs, runs[1:]):
            if after['created_at'] < before['finished_at'] <= after['started_at']:
                gaps.append((after['started_at'] - before['finished_at']).total_seconds())
    return gaps

def pct(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ms(value):
    return None if value is None else round(value * 1000, 1)


def part_mix(stack, args, submit_wait):
    from helpers import call_rows

    import heavy_lanes_client.load as load
    accounts = tuple(load.Account(row['tier'], row['token']) for row in stack.tokens()['tokens'])
    if args.warmup > 0:
        # Not measured: the same mix for --warmup seconds, so each API thread and pool process has served
        # calls before the measured run (a process's first calls open its connections).
        load.LoadGenerator(load.LoadPlan(url=stack.url, accounts=accounts, users=args.users,
                                         seconds=args.warmup, source=stack.source, seed=2,
                                         submit_wait=submit_wait)).run()
        stack.wait_drained(60)
    stack.reset_calls()
    plan = load.LoadPlan(url=stack.url, accounts=accounts, users=args.users, seconds=args.seconds,
                         source=stack.source, seed=1, submit_wait=submit_wait)
    generator = load.LoadGenerator(plan)
    offset = time.time() - time.monotonic()  # the load generator's clock is time.monotonic
    report = generator.run()
    sent_at = {call.task_id: call.started + offset for call in generator.ledger.calls if call.task_id}
    run_start = min((call.started for call in generator.ledger.calls), default=0.0)
    started = {call.task_id: call.started - run_start for call in generator.ledger.calls if call.task_id}
    rows = call_rows()
    groups = {'single': [], 'bulk': []}
    for call in report.calls:
        groups['single' if call.kind == 'single' else 'bulk'].append(call)
    out = {}
    for name, calls in groups.items():
        final = [call for call in calls if call.latency is not None and call.outcome in ('succeeded', 'failed')]
        latency = [call.latency for call in final]
        run, wait, both, served, before, after = [], [], [], {}, [], []
        for call in final:
            row = rows.get(call.task_id)
            if row is None:
                continue
            served[row['served_as']] = served.get(row['served_as'], 0) + 1
            if row['served_as'] != 'run' or not (row['started_at'] and row['finished_at']):
                continue
            run.append((row['finished_at'] - row['started_at']).total_seconds())
            if call.task_id in sent_at:
                before.append(row['created_at'].timestamp() - sent_at[call.task_id])
                after.append(sent_at[call.task_id] + call.latency - row['finished_at'].timestamp())
            wait.append((row['started_at'] - row['created_at']).total_seconds())
            both.append((row['finished_at'] - row['created_at']).total_seconds())
        gaps = handoff_gaps([rows[call.task_id] for call in final if call.task_id in rows])
        bound = (2 * pct(run, 0.99) + 0.1) if name == 'single' and run else (
            1.5 * pct(both, 0.99) if both else None)
        slowest = []
        for call in sorted(final, key=lambda c: -c.latency)[:5]:
            row = rows.get(call.task_id) or {}
            span = lambda a, b, row=row: ms((row[b] - row[a]).total_seconds()) if row.get(a) and row.get(b) else None  # noqa: E731
            slowest.append({'ms': ms(call.latency), 'sends': call.sends,
                            'at_s': round(started[call.task_id], 2) if call.task_id in started else None,
                            'decision': call.decision, 'served_as': row.get('served_as'),
                            'queue': row.get('queue'), 'worker': row.get('worker'),
                            'queue_wait_ms': span('created_at', 'started_at'),
                            'run_ms': span('started_at', 'finished_at'),
                            'before_row_ms': ms(row['created_at'].timestamp() - sent_at[call.task_id])
                            if call.task_id in sent_at else None,
                            'after_row_ms': ms(sent_at[call.task_id] + call.latency - row['finished_at'].timestamp())
                            if call.task_id in sent_at and row.get('finished_at') else None})
        out[name] = {
            'slowest': slowest,
            'calls': len(calls), 'final': len(final), 'served_as': served,
            'outcomes': {str(k): sum(1 for c in calls if c.outcome == k) for k in {c.outcome for c in calls}},
            'submit_to_final_ms': {'p50': ms(pct(latency, 0.5)), 'p99': ms(pct(latency, 0.99)),
                                   'max': ms(max(latency) if latency else None)},
            'run_ms': {'p50': ms(pct(run, 0.5)), 'p99': ms(pct(run, 0.99))},
            'queue_wait_ms': {'p50': ms(pct(wait, 0.5)), 'p99': ms(pct(wait, 0.99))},
            'wait_plus_run_p99_ms': ms(pct(both, 0.99)),
            'send_to_row_ms': {'p50': ms(pct(before, 0.5)), 'p99': ms(pct(before, 0.99))},
            'end_to_answer_ms': {'p50': ms(pct(after, 0.5)), 'p99': ms(pct(after, 0.99))},
            'handoff_ms': {'n': len(gaps), 'p50': ms(pct(gaps, 0.5)), 'p99': ms(pct(gaps, 0.99))},
            'bound_ms': ms(bound),
            'target_met': bound is not None and bool(latency) and pct(latency, 0.99) <= bound,
        }
    out['lost'] = sum(1 for call in report.calls if call.outcome is None)
    out['handoff_by_queue_ms'] = {}
    for queue in sorted({row['queue'] for row in rows.values() if row.get('queue')}):
        gaps = handoff_gaps([row for row in rows.values() if row.get('queue') == queue])
        out['handoff_by_queue_ms'][queue] = {'n': len(gaps), 'p50': ms(pct(gaps, 0.5)),
                                             'p99': ms(pct(gaps, 0.99))}
    out['wall_seconds'] = report.wall_seconds
    write_timeline(f'latency-{"mix-wait" if submit_wait else "mix-poll"}-calls', report.calls, rows, sent_at)
    stack.wait_drained(60)
    return out


def write_timeline(name, calls, rows, sent_at):
    """Every call of the run, in seconds from its first send (bench/out/<name>.json): what a stall looks
    like when the percentiles say there was one (several slow calls at the same `at`)."""
    zero = min(sent_at.values(), default=0.0)
    at = lambda value: round(value.timestamp() - zero, 4) if value else None  # noqa: E731
    timeline = []
    for call in calls:
        row = rows.get(call.task_id) or {}
        timeline.append({'kind': call.kind, 'task_id': call.task_id, 'outcome': call.outcome,
                         'sent': round(sent_at[call.task_id] - zero, 4) if call.task_id in sent_at else None,
                         'latency': call.latency, 'queue': row.get('queue'), 'worker': row.get('worker'),
                         'served_as': row.get('served_as'), 'created': at(row.get('created_at')),
                         'started': at(row.get('started_at')), 'finished': at(row.get('finished_at'))})
    write(name, {'calls': sorted(timeline, key=lambda item: item['sent'] if item['sent'] is not None else 1e9)})


class GenericClient:
    """An HTTP client that adapts to the server by the standard fields only (see the module docstring)."""

    def __init__(self, stack, token, number, args, records, lock):
        self.stack, self.number, self.args = stack, number, args
        self.records, self.lock = records, lock
        self.session = requests.Session()
        self.session.headers['Authorization'] = f'Token {token}'
        self.hold_until = 0.0

    def note(self, kind, value=1):
        with self.lock:
            self.records[kind] = self.records.get(kind, 0) + value

    def read_ratelimit(self, response):
        """Hold off the next send while a concurrency quota the server named has no room left."""
        import http_sf
        policy_text, limit_text = response.headers.get('RateLimit-Policy'), response.headers.get('RateLimit')
        if not policy_text or not limit_text:
            return
        try:
            policies = dict(http_sf.parse(policy_text.encode(), tltype='list'))
            limits = http_sf.parse(limit_text.encode(), tltype='list')
        except Exception:  # noqa: BLE001 - a field that doesn't parse is ignored, as the draft says
            self.note('ratelimit_unparsed')
            return
        self.note('ratelimit_read')
        for name, params in limits:
            unit = str(policies.get(name, {}).get('qu', ''))
            if unit == 'concurrent-requests' and params.get('r') == 0 and params.get('t'):
                self.hold_until = max(self.hold_until, time.monotonic() + float(params['t']))
                self.note('held_by_ratelimit')

    def retry_after(self, response):
        return float(response.headers.get('Retry-After') or 1)

    def batch(self, n):
        rows = [{'name': f'generic {self.number} {n} {i} {uuid.uuid4().hex[:6]}'} for i in range(self.args.rows)]
        key = uuid.uuid4().hex
        first = time.monotonic()
        give_up = first + 600
        while time.monotonic() < give_up:
            time.sleep(max(0.0, self.hold_until - time.monotonic()))
            try:
                response = self.session.post(f'{self.stack.url}/concepts/$match/?semantic=true',
                                             json={'rows': rows, 'target_repo_url': self.stack.source},
                                             headers={'Idempotency-Key': key}, timeout=(5, 660))
            except requests.ConnectionError:
                # A kept-alive connection the server closed while this client waited out a Retry-After:
                # sent again with the same Idempotency-Key, which makes that safe.
                self.note('transport_retries')
                time.sleep(1)
                continue
            self.read_ratelimit(response)
            if response.status_code in (429, 503):
                self.note(f'answers_{response.status_code}')
                time.sleep(self.retry_after(response))
                continue
            if response.status_code == 202:
                self.note('answers_202')
                response = self.poll(response, give_up)
            if response is not None and response.status_code == 200:
                body = response.json()
                body = body.get('result', body) if isinstance(body, dict) else body
                ok = isinstance(body, list) and len(body) == len(rows)
                return {'ok': ok, 'seconds': time.monotonic() - first, 'status': 200}
            return {'ok': False, 'seconds': time.monotonic() - first,
                    'status': getattr(response, 'status_code', None), 'body': getattr(response, 'text', '')[:200]}
        return {'ok': False, 'seconds': time.monotonic() - first, 'status': 'gave up'}

    def poll(self, accepted, give_up):
        location = accepted.headers.get('Location')
        if not location:
            return accepted
        url = location if location.startswith('http') else self.stack.url + location
        wait = self.retry_after(accepted)
        while time.monotonic() < give_up:
            time.sleep(wait)
            try:
                response = self.session.get(url, timeout=(5, 60))
            except requests.ConnectionError:
                self.note('transport_retries')
                wait = 1
                continue
            if response.status_code == 200 and response.json().get('state') in ('succeeded',):
                return response
            if response.status_code == 200 and response.json().get('state') in ('failed', 'cancelled', 'expired'):
                return None
            wait = self.retry_after(response)
        return None

    def run(self, results):
        for n in range(self.args.batches):
            outcome = self.batch(n)
            with self.lock:
                results.append(outcome)


def part_generic(stack, args):
    from workers.models import State, Work
    stack.reset_calls()
    stack.set_config(**GENERIC_CONFIG)
    tokens = [row['token'] for row in stack.tokens()['tokens']]
    records, results, lock = {}, [], threading.Lock()
    started = time.monotonic()
    threads = [threading.Thread(target=GenericClient(stack, tokens[n % len(tokens)], n, args, records, lock).run,
                                args=(results,), daemon=True) for n in range(args.generic_users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    wall = time.monotonic() - started
    drained = stack.wait_drained(60)
    from capacity.config import get_config
    time.sleep(1)
    leases = {key: n for key, n in stack.in_flight().items() if n}
    not_final = Work.objects.filter(state__in=(State.QUEUED, State.RUNNING)).count()
    expected = args.generic_users * args.batches
    ok = sum(1 for item in results if item['ok'])
    return {
        'users': args.generic_users, 'batches_each': args.batches, 'rows': args.rows,
        'mode': get_config().mode, 'batches': len(results), 'answered_with_every_row': ok,
        'lost': expected - ok, 'failures': [item for item in results if not item['ok']][:5],
        'answers': records, 'wall_seconds': round(wall, 2),
        'batch_seconds': {'p50': round(pct([r['seconds'] for r in results], 0.5) or 0, 2),
                          'max': round(max((r['seconds'] for r in results), default=0), 2)},
        'drained': drained, 'calls_not_final': not_final, 'leases_left': leases,
        'target_met': ok == expected and not not_final and not leases and drained
        and records.get('answers_429', 0) > 0 and records.get('held_by_ratelimit', 0) > 0,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=20)
    parser.add_argument('--users', type=int, default=8)
    parser.add_argument('--generic-users', type=int, default=4)
    parser.add_argument('--batches', type=int, default=10)
    parser.add_argument('--rows', type=int, default=20)
    parser.add_argument('--call-seconds', type=float, default=1.0, help='how long each generic call holds its slot')
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--terminology', default='hpo', choices=('hpo', 'tiny'),
                        help="the stack's source: hpo, what `make run` loads (the default since 2026-12-03), or "
                             "tiny, whose calls are 3-5 times shorter")
    parser.add_argument('--parts', default='mix-poll,mix-wait,generic')
    parser.add_argument('--warmup', type=float, default=3,
                        help='seconds of the same mix before each measured mix part, not measured (0: none)')
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    parts = args.parts.split(',')
    results = {}
    if 'mix-poll' in parts or 'mix-wait' in parts:
        with Stack(api_workers=args.api_workers, terminology=args.terminology) as stack:
            stack.django()
            for name, submit_wait in (('mix-poll', False), ('mix-wait', True)):
                if name in parts:
                    results[name] = part_mix(stack, args, submit_wait)
                    print(f'{name}:', json.dumps(results[name]), flush=True)
    if 'generic' in parts:
        # A stack of its own whose calls hold their slot a known time, so the lane fills and refuses.
        env = {'HEAVY_LANES_BENCH_CALL_SECONDS': str(args.call_seconds)}
        with Stack(api_workers=args.api_workers, terminology=args.terminology, lanes={'es2_knn': 2},
                   env=env) as stack:
            stack.django()
            results['generic'] = part_generic(stack, args)
            print('generic:', json.dumps(results['generic']), flush=True)
    write('latency', results)
    print(f'{"part":<10}{"calls":<8}{"n":>6}{"p50":>9}{"p99":>9}{"max":>9}{"run p99":>9}{"wait p99":>9}'
          f'{"bound":>9}  met')
    for part in ('mix-poll', 'mix-wait'):
        for name in ('single', 'bulk'):
            if part not in results:
                continue
            item = results[part][name]
            t = item['submit_to_final_ms']
            print(f'{part:<10}{name:<8}{item["calls"]:>6}{t["p50"]!s:>9}{t["p99"]!s:>9}{t["max"]!s:>9}'
                  f'{item["run_ms"]["p99"]!s:>9}{item["queue_wait_ms"]["p99"]!s:>9}{item["bound_ms"]!s:>9}  '
                  f'{item["target_met"]}')
    if 'generic' in results:
        g = results['generic']
        print(f'generic: {g["answered_with_every_row"]}/{g["users"] * g["batches_each"]} batches answered with '
              f'every row, answers {g["answers"]}, leases left {g["leases_left"] or 0}, met {g["target_met"]}')
    sys.exit(0 if all(part.get('target_met', True) for name, part in results.items() if name == 'generic')
             else 1)


if __name__ == '__main__':
    main()
