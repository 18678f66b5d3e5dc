"""What one call of each kind costs: Redis commands by name, Redis round trips, Redis CPU, PostgreSQL statements
and commits, and CPU by process, per call with the idle stack's rate taken away; beside a plain Celery task
and the durable floor, on the same Redis and database in the same run.

    .venv/bin/python bench/cost.py [--calls 40] [--idle-seconds 20]

A private stack (bench/stack.py) shaped as `make run` starts it where it matters for a call's cost: two API
processes (API_WORKERS' default), one lane worker per queue with the pools the default config gives them,
mode shadow, the rate limit 600/min, the config read every 10 s; no beat, maintenance worker or Flower
(nothing a call waits for; their own traffic would only be idle noise). Its processes count their Redis
round trips at the client (HEAVY_LANES_BENCH_ROUND_TRIPS_DIR, api/bench_round_trips.py): the API's, the
lane workers' main processes (Celery's consumer: kombu's BRPOP, the acks, the events) and pool processes,
and this process's own (the HTTP client; the Celery user of `plain_celery`).

`--calls` calls of each kind, one after another (each waits for the one before), in windows: a window
starts and ends with a snapshot of every counter (bench/cost_report.py), the end one taken SETTLE_SECONDS
after its last call (the calls' tails: the worker's ack and events; and PostgreSQL 15 reports an idle
backend's commits up to 10 s late), the next window starting from it. Two idle windows (before the calls and
after the last kind that runs in the default config) give the idle rate, taken away from every window over
its length. The kinds (each call distinct work unless said):

- `waited_single_row`: `POST /concepts/$match/?semantic=true`, one row, no `Prefer`: 200 with the answer;
- `async_single_row`: the same with `Prefer: respond-async` (202), then one long poll `GET /tasks/<id>/?wait=30`;
- `waited_bulk_20`: 20 rows (the es2_knn lane), waited;
- `lexical`: `POST /concepts/$match/` (no `semantic`), one row: run in the request, no lane;
- `coalesced`: a waited call identical to a call sent just before it with `Prefer: respond-async` (which it
  joins while that one is open: served_as `coalesced`), less that leader's cost: the window of N pairs
  less a window of N leaders alone (each followed by the same GAP_SECONDS pause as the pairs);
- `rate_limited_429`: a waited call of a user over the rate limit (its window filled beforehand, in shadow
  mode: the gate admits it, the rate limit refuses it): 429;
- `warm`: with warm results on (`cache.ttl_seconds` 300), the same body as a call that succeeded: 200 from
  its stored answer (served_as `cached`);
- `refused_429`: enforce mode for every client, a capacity-aware `Prefer: respond-async` call of a user whose
  per-user lane is full (one lease held in it beforehand): 429.

Beside them, in the same run: `plain_celery` (this process as a Celery user: `bench_match.apply_async(...,
queue=<the lane's queue>)`, which is `delay()` on the queue the single-row call uses, then `.get()` with
Celery's defaults, reading the django-db result as a Celery user does) and `durable_floor` (`POST
/bench/durable/?semantic=true`, api/bench_views.py: the row, the publish on commit, 202; the worker runs
the task and stores its result; then a GAP_SECONDS pause, nothing read back).

Exact regardless of the machine: commands, round trips and statements (each from a deterministic path;
the idle rate only takes away the periodic work of an idle stack). Noisy: CPU, which is read from /proc for
this stack's processes only (a PostgreSQL backend that exits inside a window takes its CPU with it).
Writes bench/out/cost.json.
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import sys
import time
from collections import Counter

import cost_report
from cost_report import CLIENT, Snapshot, delta, process_group
from helpers import distinct, write
from stack import HOME, PG_ADMIN_URL, Stack

from heavy_lanes_client.phrases import PHRASES

API_WORKERS = 2  # make run's (api/gunicorn_config.py's default)
PRODUCTION_CONFIG_SECONDS = 10
RATE_LIMIT = '600/min'  # api/settings.py's default, as make run has it
SETTLE_SECONDS = 11  # > PostgreSQL's PGSTAT_IDLE_INTERVAL (10 s): an idle backend's commits are counted by then
GAP_SECONDS = 0.3  # after a call nobody waits for (the floor, a leader): its run ends before the next
WARM_TTL_SECONDS = 300
BULK_ROWS = 20
ROUND_TRIPS = HOME / 'round-trips'
MATCH = '/concepts/$match/'
HOLDER = 'bench-cost-holder'
PICK = random.Random(20261205)
KINDS = ('waited_single_row', 'async_single_row', 'waited_bulk_20', 'refused_429', 'rate_limited_429',
         'coalesced', 'warm', 'lexical')


def single(stack):
    return {'rows': [{'name': distinct('chest pain')}], 'target_repo_url': stack.source, 'limit': 5}


def bulk(stack):
    names = PICK.sample(PHRASES, BULK_ROWS)
    names[0] = distinct(names[0])  # each call its own work
    return {'rows': [{'name': name} for name in names], 'target_repo_url': stack.source, 'limit': 5}


def call_id(response):
    location = response.headers.get('Content-Location') or response.headers.get('Location') or ''
    return location.strip('/').rpartition('/')[2] or None


class Meter:
    """Counter snapshots of one stack: Redis, the round-trip files, PostgreSQL, /proc."""

    def __init__(self, stack):
        import psycopg

        from stack import DB_NAME
        self.stack = stack
        self.leaders = {child.pid: name for name, child in stack.children.items()}
        self.db_name = DB_NAME
        self.backend = re.compile(rf'postgres: (?:\S+: )?\S+ {re.escape(DB_NAME)} ')
        self.pg = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
        self.pg.execute('CREATE EXTENSION IF NOT EXISTS pg_stat_statements')
        self.ticks = os.sysconf('SC_CLK_TCK')
        self.own_cpu_s = 0.0  # this process's CPU spent in snapshots, not the client's

    def group(self, pid, pgid):
        return process_group(pid, pgid, self.leaders, os.getpid())

    def round_trips(self):
        from api.bench_round_trips import read
        counts = Counter()
        for name, count in read(ROUND_TRIPS).items():
            pgid, pid = (int(part) for part in name.split('-'))
            counts[self.group(pid, pgid)] += count
        return dict(counts)

    def cpu(self):
        spent = Counter()
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                with open(f'/proc/{pid}/stat') as handle:
                    head, _, tail = handle.read().rpartition(')')
                fields = tail.split()
                name = self.group(int(pid), int(fields[2]))
                if name == CLIENT:
                    continue  # from getrusage, without the snapshots (snapshot())
                if name == 'other':
                    if not head.endswith('(postgres'):
                        continue
                    with open(f'/proc/{pid}/cmdline', 'rb') as handle:
                        if not self.backend.match(handle.read().replace(b'\0', b' ').decode(errors='replace')):
                            continue
                    name = 'postgres'
            except (OSError, ValueError):
                continue  # gone meanwhile
            spent[name] += (int(fields[11]) + int(fields[12])) / self.ticks
        return dict(spent)

    def postgres(self):
        statements = self.pg.execute(
            'SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid '
            'WHERE d.datname = %s', (self.db_name,)).fetchone()[0]
        commits = self.pg.execute('SELECT xact_commit FROM pg_stat_database WHERE datname = %s',
                                  (self.db_name,)).fetchone()[0]
        return int(statements), int(commits)

    def snapshot(self):
        started = _own_cpu_s()
        # The round-trip files first: this snapshot's INFO then counts in the next window, as cost_report
        # takes it out (OWN_INFO).
        round_trips, cpu, (statements, commits) = self.round_trips(), self.cpu(), self.postgres()
        cpu[CLIENT] = started - self.own_cpu_s
        info = self.stack.redis.info('cpu', 'commandstats')
        # Redis's CPU without the time its INFO commands took (only the snapshots send INFO).
        redis_cpu_s = (float(info['used_cpu_sys']) + float(info['used_cpu_user'])
                       - info.get('cmdstat_info', {}).get('usec', 0) / 1e6)
        stats = {key[len('cmdstat_'):]: value for key, value in info.items() if key.startswith('cmdstat_')}
        self.own_cpu_s += _own_cpu_s() - started
        return Snapshot(at=time.monotonic(), round_trips=round_trips, cpu_s=cpu, pg_statements=statements,
                        pg_commits=commits, redis_cpu_s=redis_cpu_s,
                        commands={name: value['calls'] for name, value in stats.items()},
                        redis_command_s=sum(value['usec'] for name, value in stats.items() if name != 'info') / 1e6)


def _own_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Run:
    def __init__(self, stack, calls):
        import requests

        from django.contrib.auth import get_user_model
        self.stack, self.calls = stack, calls
        self.meter = Meter(stack)
        self.last, self.dirty = None, True
        self.windows, self.checks = {}, {}
        self.users = {row['tier']: row for row in stack.tokens()['tokens']}
        users = get_user_model().objects.in_bulk([row['username'] for row in self.users.values()],
                                                  field_name='username')
        for row in self.users.values():
            row['id'] = users[row['username']].pk
        self.sessions = {}
        for tier, row in self.users.items():
            self.sessions[tier] = requests.Session()
            self.sessions[tier].headers['Authorization'] = f'Token {row["token"]}'

    # --- windows ------------------------------------------------------------------------------------------

    def window(self, name, send, calls, gap=0.0):
        """`calls` calls of `send` one after another in a window of their own; keeps its change and what each
        call returned."""
        if self.dirty or self.last is None:
            time.sleep(SETTLE_SECONDS)  # what was done since the last snapshot isn't this window's
            self.last = self.meter.snapshot()
        before = self.last
        results = []
        for _ in range(calls):
            results.append(send())
            if gap:
                time.sleep(gap)
        time.sleep(SETTLE_SECONDS)
        self.last, self.dirty = self.meter.snapshot(), False
        self.windows[name] = delta(before, self.last)
        self.checks[name] = results
        statuses = Counter(str(result[0]) for result in results)
        print(f'[cost] {name}: {calls} calls in {self.windows[name].at:.1f} s, {dict(statuses)}', flush=True)

    def idle(self, name, seconds):
        """A window of `seconds` with no call."""
        if self.dirty or self.last is None:
            time.sleep(SETTLE_SECONDS)
            self.last = self.meter.snapshot()
        before = self.last
        time.sleep(seconds)
        self.last, self.dirty = self.meter.snapshot(), False
        self.windows[name] = delta(before, self.last)
        print(f'[cost] {name}: {self.windows[name].at:.1f} s', flush=True)

    # --- calls --------------------------------------------------------------------------------------------

    def post(self, tier, body, semantic=True, headers=None, path=MATCH):
        query = '?semantic=true' if semantic else ''
        return self.sessions[tier].post(f'{self.stack.url}{path}{query}', json=body, headers=headers or {},
                                        timeout=60)

    def waited(self, tier='core', body=None):
        response = self.post(tier, body or single(self.stack))
        return response.status_code, call_id(response)

    def waited_bulk(self):
        response = self.post('core', bulk(self.stack))
        return response.status_code, call_id(response)

    def async_polled(self):
        response = self.post('core', single(self.stack), headers={'Prefer': 'respond-async'})
        if response.status_code != 202:
            return response.status_code, None
        task = response.json()
        polls = 0
        while task['state'] in ('queued', 'running') and polls < 5:
            polls += 1
            task = self.sessions['core'].get(f'{self.stack.url}/tasks/{task["id"]}/?wait=30', timeout=60).json()
        return task['state'], task['id'], polls

    def lexical(self):
        response = self.post('core', single(self.stack), semantic=False)
        return response.status_code, None

    def leader(self, body=None):
        response = self.post('core', body or single(self.stack), headers={'Prefer': 'respond-async'})
        return response.status_code, call_id(response)

    def pair(self):
        body = single(self.stack)
        leader = self.leader(body)
        follower = self.waited(body=body)
        return follower[0], follower[1], leader[1]

    def rate_limited(self):
        return self.waited(tier='preview')

    def refused(self):
        response = self.post('early_access', single(self.stack), headers={
            'Prefer': 'respond-async', 'X-OCL-Event-Metadata': json.dumps({'capacity_aware': 'true'})})
        return response.status_code, None

    def durable(self):
        response = self.post('core', single(self.stack), path='/bench/durable/')
        return response.status_code, response.json().get('id') if response.status_code == 202 else None

    def plain_celery(self, payloads):
        def send():
            from api.bench_views import bench_match
            body, queue = payloads.pop()
            result = bench_match.apply_async(args=[body, True, False], queue=queue)
            result.get(timeout=60)
            return result.state, result.id
        return send

    # --- set-up -------------------------------------------------------------------------------------------

    def celery_payloads(self, count):
        """The bodies plain Celery sends, validated as /bench/delay/ validates them, and their queue (outside
        any window: a Celery user's own validation isn't the task's cost)."""
        from capacity.constants import MATCH as MATCH_ENDPOINT
        from concepts import services
        from workers.lanes import route
        payloads = []
        for _ in range(count):
            payload = services.validate_match(single(self.stack), {'semantic': 'true'})
            payloads.append((payload, route(MATCH_ENDPOINT, len(payload['body']['rows']), True).name))
        self.dirty = True
        return payloads

    def fill_rate_window(self, tier):
        """Put `tier`'s user over the rate limit for the rest of the run: its window full of requests that
        count until an hour from now (capacity/lua/rate.lua counts every member scored after the window's
        start)."""
        from capacity.keys import rate_key
        limit = int(RATE_LIMIT.split('/')[0])
        seconds, micros = self.stack.redis.time()
        until_ms = seconds * 1000 + micros // 1000 + 3_600_000
        self.stack.redis.zadd(rate_key('heavy', self.users[tier]['id']),
                              {f'{HOLDER}-{number}': until_ms for number in range(limit)})
        self.dirty = True

    def fill_user_lane(self, tier):
        """Hold `tier`'s user's lane (its limit is 1 here) with a lease that lasts the rest of the run."""
        from capacity.constants import Lane
        from capacity.keys import lane_key
        seconds, micros = self.stack.redis.time()
        self.stack.redis.zadd(lane_key(Lane.USER, self.users[tier]['id']),
                              {HOLDER: seconds * 1000 + micros // 1000 + 3_600_000})
        self.dirty = True

    def warm_up(self, api_pids, rounds=4, most=20):
        """Every kind a few times, each on a new connection, until every API process served some (its first
        calls load the indexes and measure the source: not a call's cost)."""
        for number in range(most):
            for send in (self.waited, self.async_polled, self.waited_bulk, self.lexical, self.pair, self.durable,
                         self.rate_limited):
                for session in self.sessions.values():
                    session.close()  # a new connection: gunicorn gives it to any of its processes
                send()
            counting = {int(name.split('-')[1]) for name in os.listdir(ROUND_TRIPS)}
            if number + 1 >= rounds and api_pids <= counting:
                break
        else:
            print(f'[cost] warning: API processes {sorted(api_pids - counting)} served no warm-up call', flush=True)
        self.dirty = True


def api_pids(stack):
    """The API's worker processes (gunicorn's, not its master)."""
    master = stack.children['api'].pid
    found = set()
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as handle:
                fields = handle.read().rpartition(')')[2].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            found.add(int(pid))
    return found


def served(stack, ids):
    return stack.served_as([call for call in ids if call])


def checks(run, stack):
    """How each window's calls were answered and served (read after the last window)."""
    out = {}
    for name, results in run.checks.items():
        if not results:
            continue
        entry = {'answers': dict(Counter(str(result[0]) for result in results))}
        ids = [result[1] for result in results if len(result) > 1 and result[1]]
        if name in ('plain_celery', 'durable_floor'):
            from django_celery_results.models import TaskResult
            entry['results'] = dict(Counter(TaskResult.objects.filter(task_id__in=ids).values_list('status',
                                                                                                   flat=True)))
        elif ids:
            entry['served_as'] = served(stack, ids)
        if name == 'coalesced_pairs':
            entry['leaders_served_as'] = served(stack, [result[2] for result in results])
        if name == 'async_single_row':
            entry['polls'] = dict(Counter(result[2] for result in results))
        out[name] = entry
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--calls', type=int, default=40, help='calls of each kind')
    parser.add_argument('--idle-seconds', type=float, default=20, help='each of the two idle windows')
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)
    shutil.rmtree(ROUND_TRIPS, ignore_errors=True)
    ROUND_TRIPS.mkdir(parents=True)
    env = {'HEAVY_LANES_BENCH_ROUND_TRIPS_DIR': str(ROUND_TRIPS), 'HEAVY_RATE_LIMIT': RATE_LIMIT}
    with Stack(api_workers=API_WORKERS, env=env, config_seconds=PRODUCTION_CONFIG_SECONDS) as stack:
        import api.bench_views  # noqa: F401 - counts this process's round trips too (the env is set)
        run = Run(stack, args.calls)
        payloads = run.celery_payloads(args.calls + 4)
        run.fill_rate_window('preview')
        run.warm_up(api_pids(stack))
        warm_celery = run.plain_celery(payloads)
        for _ in range(4):
            warm_celery()
        stack.wait_drained()
        run.idle('idle_start', args.idle_seconds)
        run.window('waited_single_row', run.waited, args.calls)
        run.window('async_single_row', run.async_polled, args.calls)
        run.window('waited_bulk_20', run.waited_bulk, args.calls)
        run.window('lexical', run.lexical, args.calls)
        run.window('coalesced_leaders', run.leader, args.calls, gap=GAP_SECONDS)
        run.window('coalesced_pairs', run.pair, args.calls, gap=GAP_SECONDS)
        run.window('rate_limited_429', run.rate_limited, args.calls)
        run.window('plain_celery', run.plain_celery(payloads), args.calls)
        run.window('durable_floor', run.durable, args.calls, gap=GAP_SECONDS)
        run.idle('idle_end', args.idle_seconds)

        stack.set_config(cache={'ttl_seconds': WARM_TTL_SECONDS})
        body = single(stack)
        for _ in range(4):  # the first runs and stores its answer; the others warm the path
            run.waited(body=body)
        run.dirty = True
        run.window('warm', lambda: run.waited(body=body), args.calls)

        stack.set_config(mode='enforce', enforce_for='all', per_user={'early_access': 1})
        run.fill_user_lane('early_access')
        for _ in range(4):
            run.refused()
        run.window('refused_429', run.refused, args.calls)

        data = cost_report.report(run.windows, run.calls, KINDS)
        data['checks'] = checks(run, stack)
    data['settings'] = {**vars(args), 'api_workers': API_WORKERS, 'rate_limit': RATE_LIMIT,
                        'settle_seconds': SETTLE_SECONDS, 'gap_seconds': GAP_SECONDS}
    write('cost', data)
    print(json.dumps({name: {key: value for key, value in figure.items() if key in cost_report.KEYS
                             or key == 'redis_script_calls'}
                      for name, figure in {**data['kinds'], 'plain_celery': data['plain_celery'],
                                           'durable_floor': data['durable_floor']}.items()}, indent=1), flush=True)


if __name__ == '__main__':
    main()
