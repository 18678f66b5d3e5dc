"""The soak's checks and report (bench/soak.py): what the run left in the rows, the results, the workers'
logs, the lanes and the broker, each check PASS or FAIL, printed and written to bench/out/soak.json."""
import re
import statistics
import time
from collections import Counter
from pathlib import Path

from helpers import write

FINAL = ('succeeded', 'failed', 'cancelled', 'expired')
MIN_RACES = 200
SLACK_SECONDS = 1.5  # a loaded 2-core machine on top of the documented bound (as the fault tests allow)
TAKEN_OVER = re.compile(r'Heavy call (\S+) was taken over by another delivery')


class Races:
    """The cancel-race threads' records, together."""

    def __init__(self, threads):
        self.races = [race for thread in threads for race in thread.races]
        self.submissions = [entry for thread in threads for entry in thread.submissions]
        self.errors = [error for thread in threads for error in thread.errors]


class LogFile:
    """A log file as tests.integration.faults.load.capacity_lines reads a process: `output()`."""

    def __init__(self, path):
        self.path = Path(path)

    def output(self):
        return self.path.read_text(errors='replace')


def taken_over(node_kill, rows, t0):
    """(from, to) in the sampler's seconds of each call the node kill left running and a live node took
    over: from the kill to the call's end. Its retake counts it over a full lane (documented), nothing more."""
    offset = time.time() - time.monotonic()  # wall clock to the monotonic clock the sampler reads
    spans = []
    for call_id in node_kill.get('running_calls', []):
        row = rows.get(call_id)
        if row and row['attempts'] >= 2 and row['finished_at'] is not None:
            spans.append((node_kill['t'], row['finished_at'].timestamp() - offset - t0 + 0.2))
    return spans


def consuming_pools(nodes):
    """{queue: pool processes of the nodes consuming it}: a node whose share is 0 keeps its one process but
    takes nothing."""
    return {queue: sum(pool.get('processes', 0) for pool in by_node.values() if pool.get('consuming'))
            for queue, by_node in nodes.items()}


def submit_bound():
    """docs/api.md: a Redis that doesn't answer costs a submission at most the limiter's deadline plus the
    publish deadline plus the cache's timeout (the rate limit's history), here plus SLACK_SECONDS."""
    from django.conf import settings

    from common import connections
    documented = (settings.CAPACITY_REDIS_DEADLINE_SECONDS + settings.CELERY_PUBLISH_DEADLINE_SECONDS
                  + connections.ROLES['cache']().socket)
    return documented, documented + SLACK_SECONDS


def latencies(stalls, timed, documented, allowed):
    """Per stall: the submissions in flight during it (sent before SIGCONT, answered after SIGSTOP), the
    longest one and its status."""
    out = []
    for stall in stalls:
        lo, hi = stall['sigstop_abs'], stall['sigcont_abs']
        during = [(took, status) for sent, took, status in timed if sent <= hi and sent + took >= lo]
        took, status = max(during, default=(0.0, None))
        out.append({**{k: v for k, v in stall.items() if not k.endswith('_abs')}, 'submissions': len(during),
                    'statuses': dict(Counter(str(s) for _, s in during)), 'longest_s': round(took, 3),
                    'longest_status': status, 'documented_bound_s': documented, 'allowed_s': allowed,
                    'ok': took <= allowed})
    return out


def report(args, *, stack, tag, limit_of, cfg, faults, stalls, generators, posts, races, watch, sampler,
           broker_client, load_done, drained, drained_t, leases_left, members_left, probes, settings,
           lease_seconds, late_seconds, retry_seconds):
    from django_celery_results.models import TaskResult
    from helpers import call_rows

    from tests.integration.faults.load import capacity_lines
    from workers import messages
    from workers.lanes import QUEUE_NAMES, QUEUES
    from workers.pool import read_pools

    race = Races(races)
    probe_ids = {pk for probe in probes.values() for pk in probe['ids']}
    rows = {pk: row for pk, row in call_rows().items() if pk not in probe_ids}
    states = Counter(row['state'] for row in rows.values())
    not_final = [cid for cid, row in rows.items() if row['state'] not in FINAL]
    results = list(TaskResult.objects.exclude(task_id__in=probe_ids).values_list('task_id', 'status'))
    result_ids = Counter(tid for tid, _ in results)
    successes = {tid for tid, status in results if status == 'SUCCESS'}
    results_twice = {tid: n for tid, n in result_ids.items() if n > 1}
    results_orphan = [tid for tid in result_ids if tid not in rows]
    succeeded_without_result = [cid for cid, row in rows.items()
                                if row['state'] == 'succeeded' and row['served_as'] == 'run'
                                and cid not in successes]  # a call that joined an identical one has its result
    attempts = Counter(row['attempts'] for row in rows.values())

    # What the processes logged: each call's end line (workers, the sweep, the API for a cancel while queued),
    # and a run that another delivery took over while it still ran (two workers at once).
    logs = [LogFile(path) for path in sorted(stack.logs.glob('*.log'))
            if path.name.startswith(('worker-', 'api')) and not path.name.startswith('access')]
    ends, succeeded_lines = Counter(), Counter()
    for line in capacity_lines(logs):
        if line.get('task_id') in rows and line.get('state') in FINAL:
            ends[line['task_id']] += 1
            if line['state'] == 'succeeded':
                succeeded_lines[line['task_id']] += 1
    taken_while_running = Counter(match for log in logs if log.path.name.startswith('worker-')
                                  for match in TAKEN_OVER.findall(log.output()))
    ran_twice = sorted({tid for tid, n in succeeded_lines.items() if n > 1} | set(results_twice))
    run_at_once = sorted(taken_while_running)
    ends_twice = {cid: n for cid, n in ends.items() if n > 1}
    # A call whose end no process could log: a revoke that met the database fault in the worker's main
    # process (its leases then expire on their own). Reported, not a duplicate.
    ends_missing = [cid for cid, row in rows.items() if row['state'] in FINAL and not ends.get(cid)]

    # The load's calls, every one in one bucket and consistent with the server.
    calls = [(index, call) for index, generator in enumerate(generators) for call in generator.ledger.calls]
    outcomes = Counter(call.outcome for _, call in calls)
    lost, mismatched, bad_refusals, unclear_errors = [], [], [], []
    for index, call in calls:
        seen = posts.by_key.get(call.key, [])
        name = f'{"ab"[index]}{call.number}'
        if call.outcome is None:
            lost.append({'call': name, 'task': call.task_id})
        elif call.outcome in ('refused', 'rate_limited'):
            last = seen[-1] if seen else {}
            if not (last.get('status') == 429 and (last.get('retry_after') or '').isdigit()
                    and int(last['retry_after']) >= 1):
                bad_refusals.append({'call': name, 'answers': seen})
        elif call.outcome == 'error':
            if not call.reason:
                unclear_errors.append({'call': name})
            if call.task_id and call.task_id in rows and rows[call.task_id]['state'] not in FINAL:
                mismatched.append({'call': name, 'task': call.task_id, 'client': 'error',
                                   'server': rows[call.task_id]['state']})
        else:
            row = rows.get(call.task_id)
            if row is None or row['state'] != call.outcome:
                mismatched.append({'call': name, 'task': call.task_id, 'client': call.outcome,
                                   'server': row and row['state']})
    admitted = [call for _, call in calls if call.task_id]
    client_keys = {call.key for _, call in calls} | {entry['key'] for entry in race.submissions}
    rows_without_client = [cid for cid, row in rows.items() if row['idempotency_key'] not in client_keys]
    rows_per_key = Counter(row['idempotency_key'] for row in rows.values())
    keys_twice = {key: n for key, n in rows_per_key.items() if n > 1}
    decisions = Counter(call.decision for call in admitted)
    error_reasons = Counter((call.reason or '')[:80] for _, call in calls if call.outcome == 'error')
    answer_statuses = Counter(str(status) for _, _, status in posts.timed)

    # DELETEs racing the start: once a cancel answered `cancelled`, the work never completed.
    cancelled = [r for r in race.races if r.get('status') == 200]
    ran_on = [r['call'] for r in cancelled if rows.get(r['call'], {}).get('state') != 'cancelled'
              or r['call'] in successes or succeeded_lines.get(r['call'])]
    missed = [r for r in race.races if r.get('status') == 409]
    missed_wrong = [r['call'] for r in missed if rows.get(r['call'], {}).get('state') not in FINAL]
    race_statuses = Counter(str(r.get('status')) for r in race.races)
    from_queue = sum(1 for r in cancelled if r.get('started_at') is None)

    # Stalls: the submissions in flight, the longest; and the fail-open windows.
    documented, allowed = submit_bound()
    t0 = sampler.started
    for stall in stalls:
        stall['sigstop_abs'], stall['sigcont_abs'] = t0 + stall['sigstop_t'], t0 + stall['sigcont_t']
    timed = list(posts.timed) + [(entry['sent'], entry['took'], entry['status']) for entry in race.submissions]
    per_stall = latencies(stalls, timed, documented, allowed)
    windows = [tuple(stall['fail_open_window']) for stall in stalls if 'fail_open_window' in stall]
    # Fail-open is for the lanes Redis being down: no call goes ahead uncounted outside its stalls' windows
    # (the starved API processes among them).
    uncounted = [round(entry['sent'] - t0, 2) for entries in posts.by_key.values() for entry in entries
                 if entry.get('decision') == 'unavailable'
                 and not any(lo <= entry['sent'] - t0 <= hi for lo, hi in windows)]
    takeovers = taken_over(faults['node_kill'], rows, t0)
    maxima, maxima_in_window, violations, window_excess = Counter(), Counter(), [], []
    for t, counts in sampler.samples:
        inside = any(lo <= t <= hi for lo, hi in windows)
        # docs/operations.md, "A worker node is lost": a call taken over retakes its leases over a full lane.
        retaken = sum(1 for lo, hi in takeovers if lo <= t <= hi)
        for key, count in counts.items():
            lane = key[len(tag):]
            limit = limit_of(key)
            bucket = maxima_in_window if inside else maxima
            bucket[lane] = max(bucket[lane], count)
            if limit is not None and count > limit:
                excess = {'t': t, 'lane': lane, 'count': count, 'limit': limit}
                if not inside and count <= limit + retaken:
                    window_excess.append({**excess, 'taken_over': retaken})
                else:
                    (window_excess if inside else violations).append(excess)
    gaps = [b[0] - a[0] for a, b in zip(sampler.samples, sampler.samples[1:])] or [0.0]

    # The flushed broker: every call queued then ended (sent again by the sweep, or expired).
    flushed = faults['broker_flushed']['queued_calls']
    flushed_open = [cid for cid in flushed if rows.get(cid, {}).get('state') not in FINAL]
    sweep_log = (stack.logs / 'worker-maintenance.log').read_text(errors='replace')
    resent = sum(int(n) for line in sweep_log.splitlines() if 'Sweep: ' in line
                 for n in re.findall(r"'resent': (\d+)", line))
    swept_expired = sum(int(n) for line in sweep_log.splitlines() if 'Sweep: ' in line
                        for n in re.findall(r"'expired': (\d+)", line))

    # Lane concurrency after the lost ack: the pools as configured, no unsettled ack, how many of the probe's
    # calls ran at once.
    wanted = {queue.name: queue.pool_size(cfg) for queue in QUEUES}
    nodes = {queue: read_pools(stack.redis, queue) for queue in QUEUE_NAMES}
    pools = consuming_pools(nodes)
    unsettled = {node: pool.get('acks_unsettled', 0) for queue in QUEUE_NAMES for node, pool in nodes[queue].items()
                 if pool.get('acks_unsettled', 0)}
    acks_failed = {node: pool.get('acks_failed_total', 0) for queue in QUEUE_NAMES
                   for node, pool in nodes[queue].items() if pool.get('acks_failed_total', 0)}
    present = messages.present(QUEUE_NAMES, broker_client)

    duplicate = faults['duplicate_message'].get('call')
    checks = {
        'no_leaked_leases': not leases_left,
        'every_call_row_final': not not_final and drained,
        'no_call_run_twice': not ran_twice and not run_at_once and not results_orphan and not succeeded_without_result
        and not keys_twice and not rows_without_client and not ends_twice,
        'every_client_call_accounted': not lost and not mismatched and not bad_refusals and not unclear_errors,
        'in_flight_within_limits_outside_fail_open': not violations and not sampler.error,
        'no_call_uncounted_outside_fail_open': not uncounted,
        'submit_latency_within_bound_in_each_stall': all(entry['ok'] for entry in per_stall),
        'no_call_queued_past_deadline': not watch.late,
        'no_cancelled_call_ran_on': not ran_on and not missed_wrong and not race.errors,
        'flushed_calls_resent_or_expired': bool(flushed) and not flushed_open and resent > 0,
        'lane_concurrency_back_to_pool_size': bool(probes) and all(p['at_once'] == p['pool'] for p in probes.values())
        and pools == wanted and not unsettled,
        'queues_empty': not present,
        'faults_applied': bool(faults['pool_kill'].get('call')) and faults['node_kill']['ready'] and bool(duplicate)
        and 'lane' in faults['duplicate_message'] and faults['dropped_ack'].get('ack_lost', False)
        and sum(faults['read_only_database']['sessions_ended']) > 0 and len(race.races) >= MIN_RACES
        and from_queue >= 5 and len(cancelled) - from_queue >= 5 and faults['api_starved']['processes'] > 0,
    }

    print()
    print(f'Soak: {len(calls)} load calls from {args.clients} clients on {len(generators)} API servers for '
          f'{args.seconds:g} s, load done at t={load_done:.1f}s, drained at t={drained_t:.1f}s '
          f'({"ok" if drained else "TIMED OUT"})')
    for name, fault in faults.items():
        shown = fault if name != 'broker_flushed' else {**fault, 'queued_calls': len(fault['queued_calls'])}
        print(f'  fault {name}: {shown}')
    print(f'calls: {len(calls)} = '
          + ', '.join(f'{n} {o}' for o, n in sorted(outcomes.items(), key=lambda kv: str(kv[0])))
          + f'; admitted {len(admitted)} (decisions {dict(decisions)}); POST answers {dict(answer_statuses)}')
    if error_reasons:
        print(f'  client errors by reason: {dict(error_reasons)}')
    print(f'call rows: {len(rows)} by state {dict(states)}; attempts {dict(sorted(attempts.items()))}; '
          f'lease_lost {sum(1 for r in rows.values() if r["lease_lost"])}')
    print(f'duplicates run: {len(ran_twice)} calls run twice, {len(run_at_once)} run at once on two workers; '
          f'results {sum(result_ids.values())} for {len(result_ids)} calls (twice {len(results_twice)}, without a row '
          f'{len(results_orphan)}); succeeded without a result {len(succeeded_without_result)}; end logged twice '
          f'{len(ends_twice)}, never {len(ends_missing)}; the duplicated call {duplicate}: attempts '
          f'{rows.get(duplicate, {}).get("attempts")}, {rows.get(duplicate, {}).get("state")}')
    print(f'cancel races: {len(race.races)} (DELETE answers {dict(race_statuses)}); cancelled {len(cancelled)} '
          f'({from_queue} while queued, {len(cancelled) - from_queue} while running); ran on after the cancel '
          f'{len(ran_on)}; errors {race.errors[:3]}')
    print(f'flushed broker: {len(flushed)} queued calls, {len(flushed_open)} not ended; the sweep resent {resent}, '
          f'expired {swept_expired}; queued past the deadline + {late_seconds} s: {len(watch.late)}')
    print(f'lanes after the lost ack: pools {pools} (configured {wanted}); unsettled acks {unsettled or 0}; '
          f'acks failed {acks_failed}; '
          f'probes {probes and {q: {k: v for k, v in p.items() if k != "ids"} for q, p in probes.items()}}')
    print(f'submit latency during each stall (bound {documented:g} s documented, {allowed:g} s allowed):')
    for entry in per_stall:
        print(f'  {entry["seconds"]:>6g} s {"+".join(entry["redis"]):<13} t={entry["sigstop_t"]:.1f}s  '
              f'{entry["submissions"]:>4} submissions {entry["statuses"]}, longest {entry["longest_s"]:.2f} s '
              f'({entry["longest_status"]}) {"ok" if entry["ok"] else "OVER"}')
    print(f'over-admissions outside the fail-open windows {[list(w) for w in windows]} and the takeovers '
          f'{[[round(lo, 3), round(hi, 3)] for lo, hi in takeovers]}: {len(violations)} '
          f'(inside: {len(window_excess)}); samples {len(sampler.samples)} (skipped in stalls {sampler.skipped}, '
          f'unanswered {sampler.failed}), interval median {statistics.median(gaps) * 1000:.1f} ms')
    print(f'{"lane":<24}{"max outside":>12}{"max in window":>15}{"limit":>7}')
    for lane in sorted(set(maxima) | set(maxima_in_window)):
        limit = limit_of(tag + lane)
        shown_limit = limit if limit is not None else '-'
        print(f'{lane:<24}{maxima.get(lane, 0):>12}{maxima_in_window.get(lane, 0):>15}{shown_limit:>7}')
    print(f'leases after drain + {lease_seconds + 1} s: unexpired {leases_left or 0}; members left (expired, not yet '
          f'pruned) {members_left or 0}; messages on the broker {len(present)}')
    for name, ok in checks.items():
        print(f'  {"PASS" if ok else "FAIL"} {name}')
    for label, items in (('violations', violations), ('uncounted outside fail-open (t)', uncounted),
                         ('lost', lost), ('mismatched', mismatched),
                         ('bad refusals', bad_refusals), ('rows not final', not_final), ('ran twice', ran_twice),
                         ('run at once', run_at_once), ('end logged twice', ends_twice),
                         ('end never logged', ends_missing),
                         ('rows without a client call', rows_without_client), ('ran on after cancel', ran_on),
                         ('queued past the deadline', watch.late), ('flushed, not ended', flushed_open)):
        if items:
            print(f'  {label}: {list(items)[:5] if not isinstance(items, dict) else dict(list(items.items())[:5])}')
    if sampler.error:
        print(f'  the sampler failed: {sampler.error}')

    write('soak', {
        'clients': args.clients, 'seconds': args.seconds, 'terminology': args.terminology,
        'shape': {'api_servers': len(generators), 'api_workers_each': args.api_workers, 'nodes_per_lane': 2,
                  'maintenance': True},
        'settings': {**settings, 'lease_seconds': lease_seconds, 'broker': 'separate redis-server'},
        'faults': {**faults, 'broker_flushed': {**faults['broker_flushed'],
                                                'queued_calls': len(faults['broker_flushed']['queued_calls'])}},
        'stalls': per_stall, 'fail_open_windows': windows,
        'load_done_t': load_done, 'drained_t': drained_t, 'drained': drained,
        'client': {'calls': len(calls), 'outcomes': {str(k): v for k, v in outcomes.items()}, 'admitted': len(admitted),
                   'decisions': {str(k): v for k, v in decisions.items()}, 'post_answers': dict(answer_statuses),
                   'errors_by_reason': dict(error_reasons), 'lost': lost, 'mismatched': mismatched[:20],
                   'bad_refusals': bad_refusals[:20]},
        'rows': {'count': len(rows), 'states': dict(states), 'not_final': not_final[:20],
                 'attempts': {str(k): v for k, v in attempts.items()}, 'without_client_call': rows_without_client[:20],
                 'idempotency_keys_twice': keys_twice},
        'duplicates': {'ran_twice': ran_twice, 'run_at_once': run_at_once, 'results_twice': results_twice,
                       'results_without_row': results_orphan[:20],
                       'succeeded_without_result': succeeded_without_result[:20],
                       'end_logged_twice': ends_twice, 'end_never_logged': ends_missing[:20]},
        'cancel_races': {'races': len(race.races), 'answers': dict(race_statuses), 'cancelled': len(cancelled),
                         'cancelled_while_queued': from_queue, 'ran_on': ran_on, 'missed_not_final': missed_wrong,
                         'errors': race.errors[:20]},
        'flushed': {'queued': len(flushed), 'not_ended': flushed_open, 'sweep_resent': resent,
                    'sweep_expired': swept_expired},
        'queued_past_deadline': watch.late, 'lanes': {'pools': pools, 'configured': wanted, 'acks_unsettled': unsettled,
                                                      'acks_failed_total': acks_failed, 'probes': probes},
        'samples': len(sampler.samples), 'samples_skipped_in_stalls': sampler.skipped,
        'samples_unanswered': sampler.failed,
        'max_in_flight': {lane: {'outside_windows': maxima.get(lane, 0), 'in_windows': maxima_in_window.get(lane, 0),
                                 'limit': limit_of(tag + lane)}
                          for lane in sorted(set(maxima) | set(maxima_in_window))},
        'violations': violations[:20], 'excess_in_windows': window_excess[:20], 'uncounted_outside': uncounted[:20],
        'leases_unexpired': leases_left, 'leases_members_left': members_left, 'messages_left': len(present),
        'checks': checks,
    })
    return all(checks.values())
