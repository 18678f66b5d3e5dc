"""Soak: mixed load from the load generator with worker kills and a lanes-Redis hang in the middle; then
zero leaked leases, every admitted call terminal, no duplicate results, every client call accounted for,
and enforce never let a lane above its limit outside the fail-open window.

    .venv/bin/python bench/soak.py [--seconds 60] [--clients 16] [--terminology tiny] [--api-workers 3]

A private stack (bench/stack.py) with one worker per lane, plus a second redis-server started here: the
stack's own Redis holds only the lanes (REDIS_URL), the second one is the Celery broker
(CELERY_BROKER_URL) and the cache (CACHE_REDIS_URL: DRF's throttle history), so hanging the lanes Redis
exercises fail-open while the queue keeps working. Settings for every stack process:
CAPACITY_REDIS_DEADLINE_SECONDS=0.3, CAPACITY_REDIS_RETRY_SECONDS=5, CELERY_VISIBILITY_TIMEOUT=10 (a call
on a killed node is delivered again within the run). Capacity config: mode enforce, enforce_for all, the
default (small) limits, lease_seconds 15, renew_seconds 5.

Load: heavy_lanes_client.load.LoadGenerator, `--clients` users taking the four demo tokens (staff, core,
early_access, preview) in turn, the default mix (single 5, bulk 3, bulk-rerank 1, rerank 1), each user
waiting out a 429's Retry-After (capped at --max-backoff s). Every POST answer is recorded (status,
Retry-After, error_code) by a response hook keyed by Idempotency-Key.

Faults, at fractions of --seconds: 25% SIGKILL the pool process running a call (found from the HeavyCall
row's `worker` "<node> pid <pid>"); 40% SIGKILL a whole lane worker node (its process group), start it
again 2 s later; 60% SIGSTOP the lanes redis-server for --hang seconds, then SIGCONT. The fail-open window
is [SIGSTOP, SIGCONT + CAPACITY_REDIS_RETRY_SECONDS + 2 s].

The sampler reads ZCOUNT <lane> (Redis TIME, +inf) of every lane key every 50 ms (keys refreshed by SCAN
every second) with a 0.2 s socket timeout; samples during the hang are skipped. After the load: drain (no
message on the broker, no call queued or running), wait lease_seconds + 1, then check.
"""
import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict

from helpers import lane_limit, write
from soak_sampler import Sampler
from stack import HOME, Stack

from devstack.processes import Child, stop_children, tail
from devstack.redis_server import RedisStartError, start_redis
from workers.lanes import QUEUE_NAMES, QUEUES

DEADLINE_SECONDS = 0.3
RETRY_SECONDS = 5
VISIBILITY_SECONDS = 10
LEASE_SECONDS = 15
RENEW_SECONDS = 5
WINDOW_MARGIN = 2.0
FINAL = ('succeeded', 'failed', 'cancelled', 'expired')
BULK_QUEUES = tuple(queue.name for queue in QUEUES if not queue.single_row)  # a node kill prefers these


def start_broker():
    """A second private redis-server (broker + cache); returns (child, url)."""
    (HOME / 'log').mkdir(parents=True, exist_ok=True)
    try:
        return start_redis(HOME / 'log' / 'broker-redis.log', name='broker-redis', parent_pid=os.getpid())
    except RedisStartError as ex:
        sys.exit(f'the broker Redis did not start: {ex}')


def broker_depths(client):
    pipe = client.pipeline(transaction=False)
    names = [(queue, name) for queue in QUEUE_NAMES
             for name in [queue] + [f'{queue}\x06\x16{level}' for level in (0, 3, 6, 9)]]
    for _, name in names:
        pipe.llen(name)
    depths = dict.fromkeys(QUEUE_NAMES, 0)
    for (queue, _), depth in zip(names, pipe.execute()):
        depths[queue] += depth
    unacked = client.hlen('unacked')
    return depths, unacked


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--clients', type=int, default=16)
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--terminology', default='tiny', choices=('tiny', 'hpo'))
    parser.add_argument('--hang', type=float, default=5.0, help='seconds the lanes Redis stays SIGSTOPped')
    parser.add_argument('--max-backoff', type=float, default=3.0, help='cap on a user\'s wait after a 429')
    parser.add_argument('--drain-timeout', type=float, default=180.0)
    parser.add_argument('--seed', type=int, default=1)
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)

    broker, broker_url = start_broker()
    try:
        result = run(args, broker_url)
    finally:
        stop_children([broker])
    sys.exit(0 if result else 1)


def run(args, broker_url):
    import redis
    env = {'CELERY_BROKER_URL': broker_url, 'CACHE_REDIS_URL': broker_url,
           'CAPACITY_REDIS_DEADLINE_SECONDS': str(DEADLINE_SECONDS),
           'CAPACITY_REDIS_RETRY_SECONDS': str(RETRY_SECONDS),
           'CELERY_VISIBILITY_TIMEOUT': str(VISIBILITY_SECONDS)}
    config = {'mode': 'enforce', 'enforce_for': 'all', 'lease_seconds': LEASE_SECONDS,
              'renew_seconds': RENEW_SECONDS}
    broker_client = redis.Redis.from_url(broker_url, socket_timeout=5)
    faults = {}
    hung = threading.Event()
    with Stack(api_workers=args.api_workers, terminology=args.terminology, config=config, env=env) as stack:
        from capacity.config import get_config
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.db.models import Count
        from django_celery_results.models import TaskResult

        import heavy_lanes_client.load as load
        from workers.models import HeavyCall

        cfg = get_config()
        assert cfg['mode'] == 'enforce' and cfg['lease_seconds'] == LEASE_SECONDS, cfg
        tokens = stack.tokens()['tokens']
        user_tier = {str(get_user_model().objects.get(username=row['username']).pk): row['tier'] for row in tokens}
        tag = '{' + settings.CAPACITY_KEY_PREFIX + '}:'
        reserve = cfg['reserve_single_row']

        def limit_of(key):
            return lane_limit(key, tag, cfg, user_tier)

        # Record every POST answer (the submission) by its Idempotency-Key.
        answers = defaultdict(list)
        answers_lock = threading.Lock()

        def on_response(response, *a, **kw):
            if response.request.method == 'POST':
                key = response.request.headers.get('Idempotency-Key')
                entry = {'status': response.status_code, 'retry_after': response.headers.get('Retry-After'),
                         'decision': response.headers.get('X-OCL-Capacity-Decision')}
                if response.status_code == 429:
                    try:
                        entry['error_code'] = response.json().get('error_code')
                    except ValueError:
                        entry['error_code'] = None
                with answers_lock:
                    answers[key].append(entry)
            return response

        class RecordingClient(load.Client):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                self.session.hooks['response'].append(on_response)

        load.Client = RecordingClient
        accounts = tuple(load.Account(row['tier'], row['token']) for row in tokens)
        plan = load.LoadPlan(url=stack.url, accounts=accounts, users=args.clients, seconds=args.seconds,
                             source=stack.source, drain_seconds=min(600.0, args.drain_timeout),
                             max_backoff=args.max_backoff, seed=args.seed)
        generator = load.LoadGenerator(plan)

        known = [tag + lane for lane in ('api_heavy', 'es2_knn', f'api_heavy_task:{settings.CAPACITY_TASK_ID}')]
        known += [f'{tag}tier:{tier}' for tier in cfg['tiers']] + [f'{tag}user:{pk}' for pk in user_tier]
        sampler = Sampler(stack.redis_url, tag, limit_of, known, hung)
        reports = {}
        load_thread = threading.Thread(target=lambda: reports.update(report=generator.run()), name='soak-load')
        sampler.start()
        while sampler.started is None:
            time.sleep(0.01)
        t0 = sampler.started
        load_thread.start()

        def at(fraction):
            time.sleep(max(0.0, t0 + fraction * args.seconds - time.monotonic()))

        def elapsed():
            return round(time.monotonic() - t0, 3)

        worker_pgids = lambda: {stack.children[f'worker-{q}'].pid: q for q in QUEUE_NAMES}  # noqa: E731

        def running_call(queues=QUEUE_NAMES, timeout=8.0):
            """A running call on one of `queues` whose worker pid is in a stack worker's group."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for call in HeavyCall.objects.filter(state='running', queue__in=queues).exclude(worker=''):
                    node, _, pid = call.worker.rpartition(' pid ')
                    try:
                        pid = int(pid)
                        pgid = os.getpgid(pid)
                    except (ValueError, ProcessLookupError):
                        continue
                    if pgid in worker_pgids() and pid != pgid:
                        return call, pid
                time.sleep(0.05)
            return None, None

        # Fault 1: SIGKILL the pool process running a call.
        at(0.25)
        call, pid = running_call()
        if call is not None:
            os.kill(pid, signal.SIGKILL)
            faults['pool_kill'] = {'t': elapsed(), 'call': call.id, 'lane': call.queue, 'pid': pid,
                                   'worker': call.worker}
        else:
            faults['pool_kill'] = {'t': elapsed(), 'call': None, 'note': 'no running call found in 8 s'}
        print(f'[soak] t={faults["pool_kill"]["t"]:.1f}s pool kill: {faults["pool_kill"]}', flush=True)

        # Fault 2: SIGKILL a whole lane worker node (prefer one running a bulk call), start it again.
        at(0.40)
        call, _ = running_call(BULK_QUEUES, timeout=5.0)
        queue = call.queue if call is not None else 'es2_knn'
        old = stack.children[f'worker-{queue}']
        running_there = list(HeavyCall.objects.filter(state='running', queue=queue).values_list('id', flat=True))
        old.signal_group(signal.SIGKILL)
        killed_at = elapsed()
        old.process.wait(10)
        deadline = time.monotonic() + 10
        while old.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
        log_path = stack.logs / f'worker-{queue}-restarted.log'
        new = Child(old.name, old.argv, log_path, ready=lambda: ' ready.' in tail(log_path, 400))
        stack._start(new)
        deadline = time.monotonic() + 60
        while not new.check_ready() and time.monotonic() < deadline and new.running():
            time.sleep(0.1)
        faults['node_kill'] = {'t': killed_at, 'queue': queue, 'running_calls': running_there,
                               'restarted_t': elapsed(), 'ready': new.is_ready}
        print(f'[soak] t={killed_at:.1f}s node kill: {faults["node_kill"]}', flush=True)

        # Fault 3: hang the lanes Redis.
        at(0.60)
        redis_pid = stack.children['redis'].pid
        hung.set()
        time.sleep(0.1)  # the sampler's in-flight read ends before the stop
        try:
            os.kill(redis_pid, signal.SIGSTOP)
            stopped = elapsed()
            time.sleep(args.hang)
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        resumed = elapsed()
        time.sleep(0.1)
        hung.clear()
        window = (stopped - 0.2, resumed + RETRY_SECONDS + WINDOW_MARGIN)
        faults['redis_hang'] = {'sigstop_t': stopped, 'sigcont_t': resumed,
                                'fail_open_window': [round(window[0], 3), round(window[1], 3)]}
        print(f'[soak] t={stopped:.1f}s lanes Redis hang: {faults["redis_hang"]}', flush=True)

        load_thread.join()
        load_done = elapsed()
        report = reports['report']
        # Drain: no message on the broker (plain or unacked), no call queued or running.
        drain_deadline = time.monotonic() + args.drain_timeout
        drained = False
        while time.monotonic() < drain_deadline:
            depths, unacked = broker_depths(broker_client)
            if not any(depths.values()) and not unacked and not HeavyCall.objects.filter(
                    state__in=('queued', 'running')).exists():
                drained = True
                break
            time.sleep(0.2)
        drained_t = elapsed()
        time.sleep(LEASE_SECONDS + 1)
        sampler.stop()

        # --- the checks' data --------------------------------------------------------------------------
        unexpired = {key[len(tag):]: n for key, n in stack.in_flight().items() if n}
        expired_members = {key[len(tag):]: n for key in stack.lane_keys() if (n := stack.redis.zcard(key))}
        depths, unacked = broker_depths(broker_client)
        rows = {row['id']: row for row in HeavyCall.objects.values(
            'id', 'state', 'attempts', 'idempotency_key', 'queue', 'worker', 'lease_lost', 'error')}
        states = Counter(row['state'] for row in rows.values())
        not_final = [cid for cid, row in rows.items() if row['state'] not in FINAL]
        result_ids = Counter(TaskResult.objects.values_list('task_id', flat=True))
        results_twice = {tid: n for tid, n in result_ids.items() if n > 1}
        dup_groups = list(TaskResult.objects.values('task_id').annotate(n=Count('id')).filter(n__gt=1)[:20])
        results_orphan = [tid for tid in result_ids if tid not in rows]
        succeeded_without_result = [cid for cid, row in rows.items()
                                    if row['state'] == 'succeeded' and cid not in result_ids]
        attempts = Counter(row['attempts'] for row in rows.values())
        # Runs per call from the workers' `ocl_capacity` lines (this run's logs only).
        ran = Counter()
        for path in sorted(stack.logs.glob('worker-*.log')):
            for text in path.read_text(errors='replace').splitlines():
                if text.startswith('{') and '"ocl_capacity"' in text:
                    try:
                        record = json.loads(text)
                    except ValueError:
                        continue
                    if record.get('event') == 'ocl_capacity' and record.get('state') == 'succeeded':
                        ran[record.get('task_id')] += 1
        ran_twice = {tid: n for tid, n in ran.items() if n > 1}

        # Client side: every call in one bucket, consistent with the server.
        calls = list(generator.ledger.calls)
        outcomes = Counter(call.outcome for call in calls)
        lost, mismatched, bad_refusals, unclear_errors = [], [], [], []
        client_keys = set()
        for call in calls:
            client_keys.add(call.key)
            seen = answers.get(call.key, [])
            if call.outcome is None:
                lost.append({'call': call.number, 'task': call.task_id})
            elif call.outcome in ('refused', 'rate_limited'):
                last = seen[-1] if seen else {}
                if not (last.get('status') == 429 and (last.get('retry_after') or '').isdigit()
                        and int(last['retry_after']) >= 1):
                    bad_refusals.append({'call': call.number, 'answers': seen})
            elif call.outcome == 'error':
                if not call.reason:
                    unclear_errors.append({'call': call.number})
                if call.task_id and call.task_id in rows and rows[call.task_id]['state'] not in FINAL:
                    mismatched.append({'call': call.number, 'task': call.task_id, 'client': 'error',
                                       'server': rows[call.task_id]['state']})
            else:
                row = rows.get(call.task_id)
                if row is None or row['state'] != call.outcome:
                    mismatched.append({'call': call.number, 'task': call.task_id, 'client': call.outcome,
                                       'server': row and row['state']})
        admitted = [call for call in calls if call.task_id]
        rows_without_client = [cid for cid, row in rows.items() if row['idempotency_key'] not in client_keys]
        rows_per_key = Counter(row['idempotency_key'] for row in rows.values())
        keys_twice = {key: n for key, n in rows_per_key.items() if n > 1}
        decisions = Counter(call.decision for call in admitted)
        error_reasons = Counter((call.reason or '')[:80] for call in calls if call.outcome == 'error')

    # --- in flight vs limits, outside the fail-open window ------------------------------------------------
    lo, hi = window
    maxima, maxima_in_window, violations, window_excess = Counter(), Counter(), [], []
    for t, counts in sampler.samples:
        inside = lo <= t <= hi
        for key, count in counts.items():
            lane = key[len(tag):]
            limit = limit_of(key)
            (maxima_in_window if inside else maxima)[lane] = max(
                (maxima_in_window if inside else maxima)[lane], count)
            if limit is not None and count > limit:
                (window_excess if inside else violations).append({'t': t, 'lane': lane, 'count': count,
                                                                  'limit': limit})
    gaps = [b[0] - a[0] for a, b in zip(sampler.samples, sampler.samples[1:])]
    checks = {
        'no_leaked_leases': not unexpired,
        'every_call_row_final': not not_final and drained,
        'no_duplicate_results': not results_twice and not dup_groups and not results_orphan
        and not succeeded_without_result and not keys_twice and not rows_without_client and not ran_twice,
        'every_client_call_accounted': not lost and not mismatched and not bad_refusals and not unclear_errors,
        'in_flight_within_limits_outside_fail_open': not violations and not sampler.error,
        'queues_empty': not any(depths.values()) and not unacked,
        'faults_applied': bool(faults['pool_kill'].get('call')) and faults['node_kill']['ready'],
    }

    # --- print ----------------------------------------------------------------------------------------
    print()
    print(f'Soak: {args.clients} clients for {args.seconds:g} s (tiny={args.terminology == "tiny"}), load done at '
          f't={load_done:.1f}s, drained at t={drained_t:.1f}s ({"ok" if drained else "TIMED OUT"})')
    print(f'faults: pool kill t={faults["pool_kill"]["t"]:.1f}s call {faults["pool_kill"].get("call")} '
          f'({faults["pool_kill"].get("lane")}); node kill t={faults["node_kill"]["t"]:.1f}s '
          f'{faults["node_kill"]["queue"]} ({len(faults["node_kill"]["running_calls"])} running), back at '
          f't={faults["node_kill"]["restarted_t"]:.1f}s; lanes Redis SIGSTOP t={stopped:.1f}s .. SIGCONT '
          f't={resumed:.1f}s; fail-open window {lo:.1f}..{hi:.1f}s')
    print(f'client calls: {len(calls)} = ' + ', '.join(f'{n} {o}' for o, n in sorted(
        outcomes.items(), key=lambda kv: str(kv[0]))) + f'; admitted {len(admitted)} (decisions {dict(decisions)})')
    if error_reasons:
        print(f'client errors by reason: {dict(error_reasons)}')
    print(f'call rows: {len(rows)} by state {dict(states)}; attempts {dict(sorted(attempts.items()))}; '
          f'lease_lost {sum(1 for r in rows.values() if r["lease_lost"])}')
    print(f'task results: {sum(result_ids.values())} for {len(result_ids)} calls; twice {len(results_twice)}; '
          f'without a row {len(results_orphan)}; succeeded without result {len(succeeded_without_result)}; '
          f'calls that succeeded twice (worker log lines) {len(ran_twice)}')
    print(f'samples: {len(sampler.samples)} (skipped in the hang {sampler.skipped}, unanswered {sampler.failed}), '
          f'interval median {statistics.median(gaps) * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms')
    print(f'{"lane":<24}{"max outside":>12}{"max in window":>15}{"limit":>7}{"bulk limit":>12}')
    for lane in sorted(set(maxima) | set(maxima_in_window)):
        limit = limit_of(tag + lane)
        bulk = limit - reserve if lane.split(':')[0] in ('api_heavy', 'api_heavy_task', 'es2_knn') and limit else '-'
        print(f'{lane:<24}{maxima.get(lane, 0):>12}{maxima_in_window.get(lane, 0):>15}'
              f'{limit if limit is not None else "-":>7}{bulk:>12}')
    print(f'leases after drain + {LEASE_SECONDS + 1} s: unexpired {unexpired or 0}; members left (expired, '
          f'not yet pruned) {expired_members or 0}; broker depths {depths}, unacked {unacked}')
    for name, ok in checks.items():
        print(f'  {"PASS" if ok else "FAIL"} {name}')
    for label, items in (('violations', violations), ('lost', lost), ('mismatched', mismatched),
                         ('bad refusals', bad_refusals), ('rows not final', not_final),
                         ('ran twice', ran_twice), ('rows without a client call', rows_without_client),
                         ('excess inside the fail-open window', window_excess)):
        if items:
            print(f'  {label}: {list(items)[:5] if not isinstance(items, dict) else dict(list(items.items())[:5])}')
    if sampler.error:
        print(f'  the sampler failed: {sampler.error}')

    write('soak', {
        'clients': args.clients, 'seconds': args.seconds, 'terminology': args.terminology,
        'settings': {'CAPACITY_REDIS_DEADLINE_SECONDS': DEADLINE_SECONDS, 'CAPACITY_REDIS_RETRY_SECONDS':
                     RETRY_SECONDS, 'CELERY_VISIBILITY_TIMEOUT': VISIBILITY_SECONDS, 'lease_seconds': LEASE_SECONDS,
                     'renew_seconds': RENEW_SECONDS, 'broker': 'separate redis-server'},
        'faults': faults, 'fail_open_window': [round(lo, 3), round(hi, 3)],
        'load_done_t': load_done, 'drained_t': drained_t, 'drained': drained,
        'client': {'calls': len(calls), 'outcomes': {str(k): v for k, v in outcomes.items()},
                   'admitted': len(admitted), 'decisions': {str(k): v for k, v in decisions.items()},
                   'errors_by_reason': dict(error_reasons), 'lost': lost, 'mismatched': mismatched[:20],
                   'bad_refusals': bad_refusals[:20]},
        'rows': {'count': len(rows), 'states': dict(states), 'not_final': not_final[:20],
                 'attempts': {str(k): v for k, v in attempts.items()},
                 'without_client_call': rows_without_client[:20], 'idempotency_keys_twice': keys_twice},
        'results': {'count': sum(result_ids.values()), 'twice': results_twice, 'without_row': results_orphan[:20],
                    'succeeded_without_result': succeeded_without_result[:20], 'succeeded_runs_twice': ran_twice},
        'samples': len(sampler.samples), 'samples_skipped_in_hang': sampler.skipped,
        'samples_unanswered': sampler.failed,
        'sample_interval_ms': {'median': round(statistics.median(gaps) * 1000, 1),
                               'max': round(max(gaps) * 1000, 1)},
        'max_in_flight': {lane: {'outside_window': maxima.get(lane, 0), 'in_window': maxima_in_window.get(lane, 0),
                                 'limit': limit_of(tag + lane)} for lane in sorted(set(maxima) | set(maxima_in_window))},
        'violations': violations[:20], 'excess_in_window': window_excess[:20],
        'leases_unexpired': unexpired, 'leases_members_left': expired_members,
        'queues': {'depths': depths, 'unacked': unacked}, 'checks': checks,
    })
    return all(checks.values())


if __name__ == '__main__':
    main()
