"""Submission throughput: heavy `POST /concepts/$match/?semantic=true` -> 202 through the real API server,
in each capacity mode (off, shadow, enforce), against two floors on the same server, at the same
concurrency, in runs that alternate:

- `delay`: the view a Celery user writes by hand (/bench/delay/, api/bench_views.py): the body validated
  as the heavy view validates it, then the task's apply_async on the same lane queue and broker, 202 with
  the task id. No gate, no row: what a call that may be lost costs; reported as information.
- `durable`: the floor with the heavy 202's guarantee (/bench/durable/): validated the same way, a row
  written and the task published when it commits (`transaction.on_commit` + `apply_async`), 202. The
  targets are against this one.
- `bare`: a DRF view that authenticates, parses and answers 202 (/bench/submit/): no validation, no publish.

    .venv/bin/python bench/submission.py [--api-workers 3] [--connections 8] [--seconds 5] [--reps 4]
                                         [--profile 500]

A private stack (bench/stack.py): gunicorn with N sync workers, its own Redis and PostgreSQL database, and
no lane workers, so the measurement is the submission alone (a worker running the calls would take the
same two cores). Before every run the queues are purged and the lanes, call rows and results are
cleared, so each run starts from the same state. Load comes from `wrk` (one thread) with a Lua script for
the POST and its headers (`Prefer: respond-async`: without it the API waits for the result); one user
(demo-core); one row per call (the `interactive` lane), whose name carries the run and a counter, so every
call is distinct work (identical calls would join the first one's work: no lease, no message) and the
heavy calls' rows must all be `served_as` run.

What each mode does per call: `off` validates, writes the call row (also its usage record) and publishes the
message (no Redis lease, no capacity headers); `shadow` also takes a lease in every lane that applies
(api_heavy, es2_knn, tier, user) with force, so it is always admitted; `enforce` (enforce_for=all, every
limit at 100,000 so every call is admitted) takes the same leases only when there is room. In shadow and
enforce each lease lasts the queue deadline and each message waits in the broker: the reset before each run
clears them. The DRF rate limit is 100000/s (see bench/stack.py). Targets: heavy >= 0.9x the durable
floor's requests/s in off and >= 0.85x in shadow and enforce; shadow >= 0.95x off. The ratios to the delay
and bare views are reported too.

`--profile N` (default 500; 0 skips it) then times N heavy calls (enforce), N delay and N bare calls in this
process through Django's test client against the same database and Redis, with a timer around each step of the
heavy path (the functions in SECTIONS), and prints where the extra time per call goes. In-process times
leave out the HTTP server, which both paths share.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers import distinct, write
from stack import Stack

from devstack.processes import pids

HIGH = 100_000  # the largest limit the config takes
TARGETS = {'off': 0.9, 'shadow': 0.85, 'enforce': 0.85}  # heavy / the durable floor, requests/s
SHADOW_VS_OFF_TARGET = 0.95
MODES = ('off', 'shadow', 'enforce')
FLOORS = ('bare', 'delay', 'durable')
BODY_ROW = 'chest pain'
NUMBER = '@N@'  # where the Lua script writes its request counter into the row's name


def ensure_wrk():
    wrk = shutil.which('wrk')
    if not wrk:
        sys.exit('wrk is not installed: apt-get install -y wrk (or `make bench`, which installs it as root)')
    return wrk


def lua_script(path, token, body):
    """A wrk script that POSTs `body` as JSON with the token and `Prefer: respond-async`, NUMBER in it
    replaced by the request's number (1, 2, ... in this wrk process: one thread, one counter), so no two
    requests are identical work. The token stays out of the process list."""
    head, tail = json.dumps(body).split(NUMBER)
    text = '\n'.join([
        'wrk.method = "POST"',
        'wrk.headers["Content-Type"] = "application/json"',
        f'wrk.headers["Authorization"] = "Token {token}"',
        'wrk.headers["Prefer"] = "respond-async"',
        'local number = 0',
        'request = function()',
        '    number = number + 1',
        f'    return wrk.format(nil, nil, nil, {json.dumps(head)} .. number .. {json.dumps(tail)})',
        'end',
        '',
    ])
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, 'w') as handle:
        handle.write(text)
    return path


def parse_wrk(output):
    def number(pattern, default=None, cast=float):
        found = re.search(pattern, output)
        return cast(found.group(1)) if found else default

    def ms(value, unit):
        return float(value) * {'us': 0.001, 'ms': 1.0, 's': 1000.0, 'm': 60000.0}[unit]

    latency = {}
    for label in ('50', '90', '99'):
        found = re.search(rf'^\s+{label}%\s+([\d.]+)(us|ms|s|m)\s*$', output, re.M)
        if found:
            latency[f'p{label}_ms'] = round(ms(*found.groups()), 2)
    errors = re.search(r'Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)', output)
    return {
        'requests_per_s': number(r'Requests/sec:\s+([\d.]+)'),
        'requests': number(r'(\d+) requests in', cast=int),
        'non_2xx': number(r'Non-2xx or 3xx responses: (\d+)', 0, int),
        'socket_errors': sum(map(int, errors.groups())) if errors else 0,
        **latency,
    }


def run_wrk(wrk, url, script, connections, seconds):
    argv = [wrk, '-t', '1', '-c', str(connections), '-d', f'{seconds}s', '--latency', '-s', str(script), url]
    output = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    result = parse_wrk(output)
    result['argv'] = ' '.join(argv[:-3] + ['-s', Path(script).name, url])
    return result


# (label, module, class or None, function): the steps of a heavy submission, in the order they run.
SECTIONS = (
    ('authenticate (token, 1 query)', 'rest_framework.authentication', 'TokenAuthentication', 'authenticate'),
    ('validate body (find_source, cached per process)', 'concepts.services', None, 'validate_match'),
    ('fingerprint (sha256 of the body)', 'workers.submission', None, 'fingerprint'),
    ('work key (sha256; the source version, cached per process)', 'workers.sharing', None, 'work_key'),
    ('shared work: look for identical work (MGET)', 'workers.sharing', None, 'find'),
    ('gate acquire (1 EVALSHA)', 'capacity.gate', None, 'admit'),
    ('decision counter (gathered; one flush job at a time)', 'capacity.counters', None, 'record_decision'),
    ('rate limit (DRF throttle: GET + SET)', 'api.views', 'HeavyCallView', 'check_rate_limits'),
    ('shared work: claim it (SET NX)', 'workers.sharing', None, 'lead'),
    ('admission record (Admission.to_json)', 'capacity.admission', 'Admission', 'to_json'),
    ('insert the work and its call, also the usage record (BEGIN + one execute)', 'workers.lifecycle.statements',
     None, 'insert'),
    ('publish (send_task: one LPUSH)', 'workers.lifecycle.create', None, 'send'),
    ('commit (COMMIT)', 'django.db.backends.base.base', 'BaseDatabaseWrapper', 'commit'),
    ('capacity headers', 'api.views', None, 'headers'),
)


def profile_sections(stack, calls):
    """{label: mean ms per heavy call} of each step, and the mean in-process time of the heavy and bare paths;
    then each mode's and each floor's in alternating blocks (`mode_costs`). Every call is distinct work."""
    import importlib

    from django.test import Client

    timings = {label: 0.0 for label, *_ in SECTIONS}
    patched = []

    def timed(label, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                timings[label] += time.perf_counter() - started
        return wrapper

    for label, module_name, class_name, name in SECTIONS:
        owner = importlib.import_module(module_name)
        owner = getattr(owner, class_name) if class_name else owner
        original = owner.__dict__.get(name)  # None: inherited, so delete the wrapper after
        setattr(owner, name, timed(label, getattr(owner, name)))
        patched.append((owner, name, original))
    try:
        set_mode(stack, 'enforce')
        client = Client(HTTP_AUTHORIZATION=f'Token {stack.token("core")}', HTTP_PREFER='respond-async')
        paths = {'heavy': '/concepts/$match/?semantic=true', 'bare': '/bench/submit/'}
        totals = {'heavy': 0.0, 'bare': 0.0}
        for _ in range(20):  # warm: connections, caches
            for path in paths.values():
                client.post(path, new_body(stack), content_type='application/json')
        stack.reset_calls()
        for label in timings:
            timings[label] = 0.0
        for _ in range(calls):
            for name, path in paths.items():
                body = new_body(stack)
                started = time.perf_counter()
                response = client.post(path, body, content_type='application/json')
                totals[name] += time.perf_counter() - started
                assert response.status_code == 202, response.content
        stack.reset_calls()
    finally:
        for owner, name, original in patched:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
    paths['delay'] = '/bench/delay/?semantic=true'
    paths['durable'] = '/bench/durable/?semantic=true'
    modes = mode_costs(stack, client, paths, max(20, calls // 10))
    # The bare path runs authenticate too: count only the heavy calls' share of it.
    per_call = {label: round(seconds / (2 * calls if label.startswith('authenticate') else calls) * 1000, 3)
                for label, seconds in timings.items()}
    heavy, bare = (round(totals[name] / calls * 1000, 3) for name in ('heavy', 'bare'))
    steps = sum(value for label, value in per_call.items() if not label.startswith('authenticate'))
    return {'calls': calls, 'heavy_ms': heavy, 'bare_ms': bare, 'extra_ms': round(heavy - bare, 3),
            'sections_ms': per_call, 'unaccounted_ms': round(heavy - bare - steps, 3), 'modes_ms': modes}


def mode_costs(stack, client, paths, block, rounds=10):
    """Mean in-process ms per call of each floor and of the heavy call in each mode, in alternating blocks of
    `block` calls."""
    order = (*FLOORS, *MODES)
    totals = {name: [] for name in order}
    for round_number in range(rounds):
        for name in order[round_number % len(order):] + order[:round_number % len(order)]:
            if name not in FLOORS:
                set_mode(stack, name, wait=False)  # only this process reads it
            path = paths.get(name, paths['heavy'])
            bodies = [new_body(stack) for _ in range(block)]
            started = time.perf_counter()
            for body in bodies:
                client.post(path, body, content_type='application/json')
            totals[name].append((time.perf_counter() - started) / block * 1000)
        stack.reset_calls()
    return {name: {'median_ms': round(statistics.median(values), 3),
                   'spread': round(max(values) / min(values), 2)} for name, values in totals.items()}


def new_body(stack):
    """A one-row `$match` body no other call of this process sent (identical calls would share one run)."""
    return {'rows': [{'name': distinct(BODY_ROW)}], 'target_repo_url': stack.source, 'limit': 5}


def _stat(pid):
    """(process group, utime + stime in clock ticks) of a live process, or None."""
    try:
        with open(f'/proc/{pid}/stat') as handle:
            fields = handle.read().rsplit(')', 1)[1].split()
    except OSError:
        return None
    return int(fields[2]), int(fields[11]) + int(fields[12])


def _cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as handle:
            return handle.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
        return ''


def server_cpu(stack):
    """{pid: CPU ticks used so far} of the server side: gunicorn (all workers), the private Redis, and the
    PostgreSQL backends serving the bench database. Less sensitive to a busy neighbour than req/s."""
    from stack import DB_NAME
    groups = {stack.children['api'].pid, stack.children['redis'].pid}
    # A backend's title is `postgres: [<cluster>: ]<user> <database> <client> <activity>` (Debian names the
    # cluster, `15/main:`): without the optional part the bench database's backends were never counted.
    backend = re.compile(rf'postgres: (?:\S+: )?postgres {re.escape(DB_NAME)} ')
    used = {}
    for pid in pids():
        stat = _stat(pid)
        if stat is None:
            continue
        group, ticks = stat
        if group in groups or backend.match(_cmdline(pid)):
            used[pid] = ticks
    return used


def cpu_seconds_between(before, after):
    """CPU seconds used between two `server_cpu` snapshots (a process gone by `after` is left out)."""
    ticks = sum(value - before.get(pid, 0) for pid, value in after.items())
    return ticks / os.sysconf('SC_CLK_TCK')


def set_mode(stack, mode, wait=True):
    many = dict.fromkeys(('staff', 'core', 'early_access', 'preview'), HIGH)
    stack.set_config(wait=wait, mode=mode, enforce_for='all', api_heavy={'cluster': HIGH, 'per_task': HIGH},
                     es2_knn=HIGH, tiers=many, per_user=many)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--api-workers', type=int, default=3)
    parser.add_argument('--connections', type=int, default=8, help='wrk connections (the concurrency)')
    parser.add_argument('--seconds', type=float, default=5, help='length of one run')
    parser.add_argument('--reps', type=int, default=4, help='rounds of bare, delay, off, shadow, enforce')
    parser.add_argument('--terminology', default='hpo', choices=('hpo', 'tiny'))
    parser.add_argument('--profile', type=int, default=500, metavar='N',
                        help='calls of each path timed step by step in-process (0: skip)')
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    wrk = ensure_wrk()
    seconds = max(1, round(args.seconds))

    with Stack(api_workers=args.api_workers, lanes={}, terminology=args.terminology) as stack, \
            tempfile.TemporaryDirectory(prefix='hl-wrk-') as scratch:
        from workers.models import Call

        def script_for(run):
            """The run's wrk script: its rows are named `chest pain <run>-<n>`, distinct from any other run's."""
            body = {'rows': [{'name': f'{BODY_ROW} {run}-{NUMBER}'}], 'target_repo_url': stack.source,
                    'limit': 5}
            return lua_script(Path(scratch) / f'post-{run}.lua', stack.token('core'), body)

        heavy_url = f'{stack.url}/concepts/$match/?semantic=true'
        targets = {'bare': f'{stack.url}/bench/submit/', 'delay': f'{stack.url}/bench/delay/?semantic=true',
                   'durable': f'{stack.url}/bench/durable/?semantic=true', **dict.fromkeys(MODES, heavy_url)}
        # Warm every gunicorn worker on every path (imports, connections, the config cache).
        set_mode(stack, 'enforce')
        for name in ('bare', 'delay', 'durable', 'enforce'):
            run_wrk(wrk, targets[name], script_for(f'warm{name}'), args.connections, 2)
        stack.reset_calls()

        runs = {name: [] for name in targets}
        order = [*FLOORS, *MODES]
        for rep in range(args.reps):
            rotated = order[rep % len(order):] + order[:rep % len(order)]
            for name in rotated:
                if name in MODES:
                    set_mode(stack, name)
                stack.reset_calls()
                script = script_for(f'{rep + 1}{name}')
                cpu_before = server_cpu(stack)
                result = run_wrk(wrk, targets[name], script, args.connections, seconds)
                result['server_cpu_ms_per_request'] = round(
                    cpu_seconds_between(cpu_before, server_cpu(stack)) * 1000 / max(result['requests'], 1), 3)
                extra = ''
                if name != 'bare':
                    time.sleep(0.3)  # requests still in flight when wrk stopped
                    result['messages_queued'] = sum(stack.queue_depths().values())
                    extra = f'  msgs {result["messages_queued"]}'
                if name in MODES:
                    result['rows_written'] = Call.objects.count()
                    result['leases_held'] = sum(stack.in_flight().values())
                    result['served_as'] = stack.served_as()
                    extra = (f'  rows {result["rows_written"]}{extra} leases {result["leases_held"]} '
                             f'served_as {result["served_as"]}')
                runs[name].append(result)
                print(f'rep {rep + 1} {name:>8}: {result["requests_per_s"]:8.1f} req/s  server CPU '
                      f'{result["server_cpu_ms_per_request"]:.2f} ms/req  p50 '
                      f'{result.get("p50_ms")} ms  p99 {result.get("p99_ms")} ms  non-2xx {result["non_2xx"]}'
                      + extra, flush=True)
        stack.reset_calls()
        argv_example = runs['enforce'][0]['argv']
        profile = profile_sections(stack, args.profile) if args.profile else None

    summary = summarize(runs)
    for name in targets:
        line = summary[name]
        print(f'{name:>8}: median {line["median_rps"]:8.1f} req/s (runs {line["rps"]}), server CPU '
              f'{line["cpu_ms_per_request"]:.2f} ms/req'
              + (f'  = {line["vs_durable"]:.2f}x durable (per-rep {line["vs_durable_runs"]}; by CPU '
                 f'{line["vs_durable_cpu"]:.2f}x), {line["vs_delay"]:.2f}x delay (by CPU '
                 f'{line["vs_delay_cpu"]:.2f}x), {line["ratio"]:.2f}x bare' if name in MODES else '')
              + (f'  = {line["ratio"]:.2f}x bare (by CPU {line["cpu_ratio"]:.2f}x)'
                 if name in FLOORS[1:] else ''))
    met = {mode: summary[mode]['vs_durable'] >= TARGETS[mode] for mode in MODES}
    met['shadow_vs_off'] = summary['shadow_vs_off'] >= SHADOW_VS_OFF_TARGET
    print('heavy/durable floor: ' + ', '.join(f'{mode} {summary[mode]["vs_durable"]:.2f} (target >= '
                                              f'{TARGETS[mode]})' for mode in MODES)
          + '; heavy/delay: ' + ', '.join(f'{mode} {summary[mode]["vs_delay"]:.2f}' for mode in MODES)
          + f'; shadow/off {summary["shadow_vs_off"]:.2f} (target >= {SHADOW_VS_OFF_TARGET}; by CPU '
          f'{summary["shadow_vs_off_cpu"]:.2f}, enforce/off by CPU {summary["enforce_vs_off_cpu"]:.2f})')
    print('run-to-run spread: ' + ', '.join(f'{floor} {summary[f"{floor}_spread"]:.2f}' for floor in FLOORS))
    shared = {mode: sum(n for run in runs[mode] for kind, n in run['served_as'].items() if kind != 'run')
              for mode in MODES}
    print(f'heavy rows not served_as run (should be 0): {shared}')
    if profile:
        print(f'\nIn-process, {profile["calls"]} calls each: heavy {profile["heavy_ms"]:.2f} ms, bare '
              f'{profile["bare_ms"]:.2f} ms, extra {profile["extra_ms"]:.2f} ms per call:')
        for label, value in profile['sections_ms'].items():
            print(f'  {value:7.3f} ms  {label}')
        print(f'  {profile["unaccounted_ms"]:7.3f} ms  the rest of the heavy view (DRF, routing, Prefer, config, '
              f'the row object, the 202 body)')
        modes = profile['modes_ms']
        print('In-process ms per call (alternating blocks; median, max/min spread): '
              + ', '.join(f'{name} {line["median_ms"]:.2f} (x{line["spread"]})' for name, line in modes.items())
              + f'; shadow - off {modes["shadow"]["median_ms"] - modes["off"]["median_ms"]:+.2f} ms, '
              f'enforce - off {modes["enforce"]["median_ms"] - modes["off"]["median_ms"]:+.2f} ms, '
              f'off - durable {modes["off"]["median_ms"] - modes["durable"]["median_ms"]:+.2f} ms')
    write('submission', {
        'heavy_vs_durable_floor': {mode: summary[mode]['vs_durable'] for mode in MODES},
        'heavy_vs_delay': {mode: summary[mode]['vs_delay'] for mode in MODES},
        'shadow_vs_off': summary['shadow_vs_off'], 'load': os.getloadavg(),
        'api_workers': args.api_workers, 'connections': args.connections, 'seconds': seconds, 'reps': args.reps,
        'wrk': argv_example, 'runs': runs, 'summary': summary, 'profile': profile, 'not_run': shared,
        'targets': {'heavy_vs_durable_floor': TARGETS, 'shadow_vs_off': SHADOW_VS_OFF_TARGET, 'met': met},
    })


def summarize(runs):
    """Medians per path, and each path's ratios to the floors (requests/s, and the CPU alone allows)."""
    summary = {}
    floors = {}
    for floor in FLOORS:
        rps = [run['requests_per_s'] for run in runs[floor]]
        floors[floor] = {'rps': rps, 'median': statistics.median(rps),
                         'cpu': statistics.median(run['server_cpu_ms_per_request'] for run in runs[floor])}
    for name, items in runs.items():
        rps = [run['requests_per_s'] for run in items]
        cpu = [run['server_cpu_ms_per_request'] for run in items]
        line = {'median_rps': round(statistics.median(rps), 1), 'rps': [round(x, 1) for x in rps],
                'cpu_ms_per_request': round(statistics.median(cpu), 3),
                'p50_ms': statistics.median(run.get('p50_ms') or 0 for run in items),
                'p99_ms': statistics.median(run.get('p99_ms') or 0 for run in items),
                'non_2xx': sum(run['non_2xx'] for run in items)}
        # Throughput the CPU alone allows, relative to a floor: the floor's CPU per request / this path's.
        if name != 'bare':
            line['ratio'] = round(line['median_rps'] / floors['bare']['median'], 3)
            line['ratios'] = [round(x / b, 2) for x, b in zip(rps, floors['bare']['rps'])]
            line['cpu_ratio'] = round(floors['bare']['cpu'] / line['cpu_ms_per_request'], 3)
        for floor in FLOORS[1:] if name in MODES else ():
            line[f'vs_{floor}'] = round(line['median_rps'] / floors[floor]['median'], 3)
            line[f'vs_{floor}_runs'] = [round(x / b, 2) for x, b in zip(rps, floors[floor]['rps'])]
            line[f'vs_{floor}_cpu'] = round(floors[floor]['cpu'] / line['cpu_ms_per_request'], 3)
        summary[name] = line
    summary['shadow_vs_off'] = round(summary['shadow']['median_rps'] / summary['off']['median_rps'], 3)
    summary['shadow_vs_off_cpu'] = round(summary['off']['cpu_ms_per_request']
                                         / summary['shadow']['cpu_ms_per_request'], 3)
    summary['enforce_vs_off_cpu'] = round(summary['off']['cpu_ms_per_request']
                                          / summary['enforce']['cpu_ms_per_request'], 3)
    for floor in FLOORS:
        summary[f'{floor}_spread'] = round(max(floors[floor]['rps']) / min(floors[floor]['rps']), 3)
    return summary


if __name__ == '__main__':
    main()
