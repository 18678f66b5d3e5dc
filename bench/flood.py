"""The benchmark users feel: the same heavy work in two worlds on one machine, under a flood of bulk matching.

- `in_request`, the seed's world: semantic `$match` runs inside the request (/bench/inrequest/$match/,
  api/bench_views.py) on gunicorn **sync** workers (4, as OCL's API containers run), which also serve the
  lexical `$match` and `/healthz`.
- `heavy_lanes`: the API as `make run` serves it (2 gthread processes, api/gunicorn_config.py), the lane
  workers with the default lane config (mode shadow; pools interactive 1, es2_knn 2, api_heavy 3).

Each world runs on its own private stack (bench/stack.py), one after the other. In each: a short warm-up
(every process loads its indexes), then an idle phase (the trickle alone), then, for each N, N bulk users
sending semantic `$match` batches of BULK_ROWS rows, 2 in flight each, as the Mapper's auto-match does
(they post and wait for the answer; a 202 handle, when the host can't hold another waiting request, is
polled as its Retry-After says), for a fixed time, beside a steady trickle of lexical `$match`, single-row
semantic `$match` and `/healthz` (one request at a time each, one every TRICKLE_SECONDS). The bulk users
run in a process of their own, as they run on other machines than the person waiting for a lexical match:
in the trickle's process their threads' GIL would be in the trickle's figures. The first
WARM_SECONDS of each phase are left out of its figures; a bulk call counts when its answer came back within
the phase. Between phases the bulk users' calls in flight end (nothing is cancelled or dropped).

Figures per world and N (bench/flood_report.py): p99 of each trickle and its idle p99, the single-row calls'
own run p99 (the in-request view's X-Run-Ms; a Heavy Lanes work's started -> finished), bulk rows/s, errors;
p50s, refusals and handles in `detail`. Targets are checked for Heavy Lanes at the largest N.

    .venv/bin/python bench/flood.py [--users 2,8,32] [--seconds 25] [--idle-seconds 15]
                                    [--worlds in_request,heavy_lanes] [--es2-knn N] [--rounds 1] [--name flood]

`--es2-knn N` runs Heavy Lanes with that es2_knn limit instead of the default (its bulk pool: N - 1), to
see how much of a bulk gap is the number of processes; `--rounds R` runs the worlds R times, alternating
(in-request, Heavy Lanes, in-request, ...), checks the targets within each round and counts the rounds that
met each (the first round's figures stay at the top of the output, every round's under `rounds`); `--name`
names the output (bench/out/<name>.json).
"""
import argparse
import multiprocessing
import os
import random
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import requests
from flood_report import FIG_KEYS, TRICKLES, Phase, detail, figure, targets, tally
from helpers import distinct, write
from stack import Stack

from devstack.processes import Child, free_port, http_get
from heavy_lanes_client.phrases import PHRASES

BULK_ROWS = 20
IN_FLIGHT = 2           # calls in flight per bulk user, as the Mapper's auto-match sends them
TRICKLE_SECONDS = 0.5   # one request of each trickle every this long (or right after a slower one)
WARM_SECONDS = 3        # left out at the start of each phase
SYNC_WORKERS = 4        # the in-request world's gunicorn sync workers, as OCL's API containers run
API_WORKERS = 2         # Heavy Lanes' gthread processes, as `make run` and compose run them
TIMEOUT = 300
# The config cache and the pool reconciler refresh as `make run` and compose have them (api/settings.py's
# CAPACITY_CONFIG_CACHE_SECONDS): nothing here changes the config after the start, and a refresh every second
# (bench/stack.py's default) re-reads the config and each caller's plan in every process once a second.
PRODUCTION_CONFIG_SECONDS = 10
FINAL = ('succeeded', 'failed', 'cancelled', 'expired')


def load():
    """Uptime's load averages now (the machine is shared: figures are read beside it)."""
    return os.getloadavg()


@dataclass
class Sample:
    kind: str           # 'bulk' or a trickle
    started: float      # monotonic s
    ended: float
    ok: bool
    refused: bool = False
    handle: bool = False
    run_ms: float | None = None
    call_id: str | None = None


@dataclass
class World:
    """Where a world's requests go: `url` serves all of them; semantic `$match` at `semantic_path`."""

    name: str
    url: str
    semantic_path: str
    samples: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, sample):
        with self.lock:
            self.samples.append(sample)

    def take(self):
        with self.lock:
            samples, self.samples = self.samples, []
        return samples


def rows_body(source, rows):
    picked = random.sample(PHRASES, rows)
    picked[0] = distinct(picked[0])  # identical calls would share one run: each call is its own work
    return {'rows': [{'name': name} for name in picked], 'target_repo_url': source, 'limit': 5}


def semantic(world, session, kind, body):
    """One semantic `$match` as a client that doesn't poll sends it: post and wait; a handle is polled."""
    started = time.monotonic()
    response = session.post(world.url + world.semantic_path, json=body, timeout=TIMEOUT)
    run_ms = float(response.headers['X-Run-Ms']) if 'X-Run-Ms' in response.headers else None
    call_id = (response.headers.get('Content-Location') or '').strip('/').rpartition('/')[2] or None
    if response.status_code == 429:
        return Sample(kind, started, time.monotonic(), ok=False, refused=True)
    if response.status_code != 202:
        return Sample(kind, started, time.monotonic(), ok=response.status_code == 200, run_ms=run_ms,
                      call_id=call_id)
    location = response.headers['Location']
    call_id = location.strip('/').rpartition('/')[2]
    while True:  # the host held no more waiting requests: poll the handle as told
        polled = session.get(f'{world.url}{location}?wait=20', timeout=TIMEOUT)
        state = polled.json().get('state') if polled.status_code == 200 else 'error'
        if state in FINAL or state == 'error':
            return Sample(kind, started, time.monotonic(), ok=state == 'succeeded', handle=True, call_id=call_id)
        time.sleep(int(polled.headers.get('Retry-After') or 1))


def trickle(world, session, kind, source):
    if kind == 'single':
        return semantic(world, session, kind, rows_body(source, 1))
    started = time.monotonic()
    if kind == 'healthz':
        response = session.get(f'{world.url}/healthz', timeout=TIMEOUT)
    else:
        response = session.post(f'{world.url}/concepts/$match/', json=rows_body(source, 1), timeout=TIMEOUT)
    return Sample(kind, started, time.monotonic(), ok=response.status_code == 200,
                  refused=response.status_code == 429)


def guarded(kind, send):
    started = time.monotonic()
    try:
        return send()
    except requests.RequestException:
        return Sample(kind, started, time.monotonic(), ok=False)


def session_for(token):
    session = requests.Session()
    session.headers['Authorization'] = f'Token {token}'
    return session


def start_clients(world, stack, users):
    """The trickles (a thread each, in this process) and `users` x IN_FLIGHT bulk senders (threads of a process
    of their own, bulk_users); returns the function that stops them all and gathers their samples into
    `world`. The bulk users are another process as they are other machines: 64 threads reading 20-row
    answers hold a process's GIL, and in the trickle's process that wait would be in the trickle's figures."""
    source = stack.source
    bulk, senders = None, users * IN_FLIGHT
    if senders:  # forked before this process starts the trickle's threads
        fork = multiprocessing.get_context('fork')
        bulk_stop, out = fork.Event(), fork.SimpleQueue()
        bulk = fork.Process(target=bulk_users, name='flood-bulk', daemon=True, args=(
            world.url, world.semantic_path, stack.token('core'), source, senders, bulk_stop, out))
        bulk.start()
    stop = threading.Event()

    def trickler(kind):
        session = session_for(stack.token('early_access'))
        while not stop.is_set():
            sample = guarded(kind, lambda: trickle(world, session, kind, source))
            world.add(sample)
            stop.wait(max(TRICKLE_SECONDS - (sample.ended - sample.started), 0))

    threads = [threading.Thread(target=trickler, args=(kind,), daemon=True) for kind in TRICKLES]
    for thread in threads:
        thread.start()

    def finish():
        stop.set()
        if bulk is not None:
            bulk_stop.set()
        for thread in threads:
            thread.join(TIMEOUT)
        if bulk is not None:
            for sample in out.get():  # before the join: the child's put waits for this read
                world.add(sample)
            bulk.join(TIMEOUT)
    return finish


def bulk_users(url, semantic_path, token, source, senders, stop, out):
    """`senders` threads each sending bulk calls one after the other until `stop`; their samples to `out`."""
    random.seed()  # not the parent's sequence of rows
    world = World('bulk', url, semantic_path)

    def bulk():
        session = session_for(token)
        while not stop.is_set():
            world.add(guarded('bulk', lambda: semantic(world, session, 'bulk', rows_body(source, BULK_ROWS))))

    threads = [threading.Thread(target=bulk, daemon=True) for _ in range(senders)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(TIMEOUT)
    out.put(world.take())


def run_phase(world, stack, users, seconds):
    """One phase: the trickles and `users` bulk users for WARM_SECONDS + `seconds`; its Phase."""
    world.take()
    begun = time.monotonic()
    finish = start_clients(world, stack, users)
    time.sleep(WARM_SECONDS + seconds)
    finish()
    low, high = begun + WARM_SECONDS, begun + WARM_SECONDS + seconds
    phase = Phase(seconds=seconds)
    for sample in world.take():
        counted = low <= sample.started <= high if sample.kind != 'bulk' else low <= sample.ended <= high
        if not counted:
            continue
        phase.refusals += sample.refused
        phase.handles += sample.handle
        phase.errors += not sample.ok and not sample.refused
        if sample.kind == 'bulk':
            phase.bulk_rows += BULK_ROWS if sample.ok else 0
            run = sample.run_ms if sample.run_ms is not None else work_run_ms(sample.call_id)
            if sample.ok and run is not None:
                phase.bulk_run_ms.append(run)
                phase.bulk_latency_ms.append((sample.ended - sample.started) * 1000)
            continue
        if sample.ok:
            phase.add(sample.kind, (sample.ended - sample.started) * 1000, sample.started - low)
        if sample.kind == 'single' and sample.ok:
            run = sample.run_ms if sample.run_ms is not None else work_run_ms(sample.call_id)
            if run is not None:
                phase.run_ms.append(run)
    return phase


def work_run_ms(call_id):
    """A Heavy Lanes call's own work, started -> finished, ms (None when unknown)."""
    from workers.models import Call
    call = Call.objects.select_related('work').filter(pk=call_id).first() if call_id else None
    if call is None or call.work.started_at is None or call.work.finished_at is None:
        return None
    return (call.work.finished_at - call.work.started_at).total_seconds() * 1000


def warm(world, stack, calls):
    """Every process that will run the work loads its indexes before anything is measured."""
    finish = start_clients(world, stack, (calls + 1) // IN_FLIGHT)
    time.sleep(4)
    finish()
    world.take()


def start_sync_server(stack):
    """gunicorn sync workers beside the stack's own API, on the stack's database and Redis: OCL's server."""
    port = free_port()
    child = stack._start(Child('api-sync', [
        sys.executable, '-m', 'gunicorn', '-c', 'python:api.gunicorn_config', 'api.wsgi:application',
        '--bind', f'127.0.0.1:{port}', '--worker-class', 'sync', '--workers', str(SYNC_WORKERS), '--threads', '1',
        '--access-logfile', str(stack.logs / 'access-sync.log'), '--log-level', 'warning',
    ], stack.logs / 'api-sync.log', ready=lambda: http_get(f'http://127.0.0.1:{port}/healthz')[0] == 200))
    deadline = time.monotonic() + 120
    while not child.check_ready():
        if not child.running() or time.monotonic() > deadline:
            raise RuntimeError(f'the sync server did not start (see {stack.logs / "api-sync.log"})')
        time.sleep(0.2)
    return f'http://127.0.0.1:{port}'


@contextmanager
def started(name, config=None):
    """The world `name` on a private stack of its own, every process that runs the work warm: (World, Stack)."""
    in_request = name == 'in_request'
    stack = Stack(api_workers=1 if in_request else API_WORKERS, lanes={} if in_request else None, config=config,
                  config_seconds=PRODUCTION_CONFIG_SECONDS)
    with stack:
        if in_request:
            world = World(name, start_sync_server(stack), '/bench/inrequest/$match/?semantic=true')
            warm(world, stack, SYNC_WORKERS * 2)
        else:
            world = World(name, stack.url, '/concepts/$match/?semantic=true')
            warm(world, stack, 6)
            stack.wait_drained()
        yield world, stack


def run_world(name, users, seconds, idle_seconds, config=None):
    """{N: FIG} and {N or 'idle': detail} of one world, each phase's load averages beside it."""
    in_request = name == 'in_request'
    with started(name, config) as (world, stack):
        idle = run_phase(world, stack, 0, idle_seconds)
        details = {'idle': {**detail(idle), 'load': load()}}
        print(f'[{name}] idle: ' + describe(figure(idle, idle), details['idle']), flush=True)
        figs = {}
        for n in users:
            phase = run_phase(world, stack, n, seconds)
            if not in_request:
                stack.wait_drained()
            figs[n] = figure(phase, idle)
            details[n] = {**detail(phase), 'load': load()}
            print(f'[{name}] N={n}: ' + describe(figs[n], details[n]), flush=True)
    return figs, details


def describe(fig, more):
    return (f"lexical p50/p99 {more['lexical_p50_ms']}/{fig['lexical_p99_ms']} ms, single "
            f"{more['single_p50_ms']}/{fig['single_p99_ms']} ms (run p99 {fig['single_run_p99_ms']}), healthz "
            f"{more['healthz_p50_ms']}/{fig['healthz_p99_ms']} ms, bulk {fig['bulk_rows_per_s']} rows/s, errors "
            f"{fig['errors']}, refusals {more['refusals']}, handles {more['handles']}, bulk call p50 "
            f"{more['bulk_p50_ms']} ms (its run {more['bulk_run_p50_ms']}), load "
            + '/'.join(f'{x:.1f}' for x in more['load']))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--users', default='2,8,32', help='bulk users of each phase, comma-separated')
    parser.add_argument('--seconds', type=float, default=25, help='measured length of each phase')
    parser.add_argument('--idle-seconds', type=float, default=15)
    parser.add_argument('--worlds', default='in_request,heavy_lanes')
    parser.add_argument('--es2-knn', type=int, help="Heavy Lanes' es2_knn limit (default: the config's)")
    parser.add_argument('--rounds', type=int, default=1, help='run the worlds this many times, alternating')
    parser.add_argument('--name', default='flood', help='bench/out/<name>.json')
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error('--rounds must be at least 1')
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    users = [int(n) for n in args.users.split(',')]
    lanes = {'es2_knn': args.es2_knn} if args.es2_knn else None
    rounds = []
    for number in range(1, args.rounds + 1):
        results, details = {}, {}
        for name in args.worlds.split(','):
            results[name], details[name] = run_world(name, users, args.seconds, args.idle_seconds,
                                                     None if name == 'in_request' else lanes)
        met = {}
        if 'in_request' in results and 'heavy_lanes' in results:
            met = targets(results['in_request'], results['heavy_lanes'], max(users))
            for check, line in met.items():
                print(f"{f'[round {number}] ' if args.rounds > 1 else ''}target {check}: {line['value']} vs "
                      f"{line['bound']} -> {'met' if line['met'] else 'NOT met'}", flush=True)
        assert all(tuple(fig) == FIG_KEYS for world in results.values() for fig in world.values())
        rounds.append({**{name: {str(n): fig for n, fig in figs.items()} for name, figs in results.items()},
                       'detail': details, 'targets': met})
    counted = tally([one['targets'] for one in rounds if one['targets']])
    if args.rounds > 1:
        for check, line in counted.items():
            print(f"target {check}: met in {line['met']} of {line['rounds']} rounds ({line['values']} vs "
                  f"{line['bounds']})")
    write(args.name, {**rounds[0], 'rounds': rounds if args.rounds > 1 else [], 'targets_met': counted,
                    'settings': {'bulk_rows': BULK_ROWS, 'in_flight': IN_FLIGHT, 'trickle_seconds': TRICKLE_SECONDS,
                                 'warm_seconds': WARM_SECONDS, 'seconds': args.seconds,
                                 'idle_seconds': args.idle_seconds, 'sync_workers': SYNC_WORKERS,
                                 'api_workers': API_WORKERS, 'es2_knn': args.es2_knn, 'rounds': args.rounds}})


if __name__ == '__main__':
    main()
