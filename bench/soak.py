"""Soak: mixed load on two API servers and two worker nodes per lane, with every fault of issue 18 in the
middle (worker kills, Redis stalls of 0.5 to 20 s, a duplicate message, a dropped ack, DELETEs racing the
start, a flushed broker, a read-only database); then no lease left, every call ended and run once, no
cancelled call run on, every submission answered within the documented bound during each stall, enforce
never let a lane above its limit outside the fail-open windows (a call taken over from the killed node may
be counted over a full lane until it ends, as docs/operations.md says), and each lane back to its pool size.

    .venv/bin/python bench/soak.py [--seconds 180] [--clients 16] [--terminology tiny] [--api-workers 1]

The stack (bench/stack.py): two gunicorn servers, each its own API host (CAPACITY_TASK_ID api-a, api-b)
with `--api-workers` processes (default 1: two API processes in all), as the fault tests run them
(tests/integration/faults/test_redis_pause.py starts two one-process gunicorns): two hosts, not one
master's two workers, so each has its own waiting cap and `api_heavy_task` lane, and a stall meets two
independent request paths; two Celery nodes per lane queue (`<queue>@a-%h`, `<queue>@b-%h`: the
reconcilers split each pool over them); Celery beat and the maintenance worker, the sweep every
WORKERS_SWEEP_SECONDS=1 s with WORKERS_SWEEP_GRACE_SECONDS=3 s (a queued call without a message is sent
again after 3 s; one past its queue deadline, 30 s here, ends `expired`). The stack's own redis-server
holds the lanes; a second one started here is the broker and the cache (CELERY_BROKER_URL,
CACHE_REDIS_URL), so a stall can hit the lanes, the broker or both. Every stack process has
CAPACITY_REDIS_DEADLINE_SECONDS=0.3, CAPACITY_REDIS_RETRY_SECONDS=5, CELERY_VISIBILITY_TIMEOUT=70 (a
killed node's call is delivered again within the run; the config must keep queue.deadline_seconds +
max_hold_seconds + renew_seconds under it, so those are 30 + 30 + 5 s). Capacity config: enforce for
all, the default (small) limits, lease_seconds 15, renew_seconds 5.

Load: two heavy_lanes_client LoadGenerators, one per API server, `--clients` users in all over the four
demo tokens, the default mix, each user waiting out a 429's Retry-After (capped at --max-backoff s), its
POSTs answered at once (LoadPlan.submit_wait off: the stall checks time the submission, not the result);
every POST is timed and its answer recorded by Idempotency-Key. Beside it, a thread submits small es2_knn calls
as the staff user and DELETEs each at once (a varied 0-0.1 s after its 202, or as a worker picks it up),
two such threads, one on each server, until 95 % of --seconds and at least 200 races (up to 60 s more).

Faults, at fractions of --seconds: 6 % a running call's taken message pushed onto its queue again (a
duplicate); 12 % SIGKILL of the pool process running a call; 17 % SIGSTOP of both redis-servers for
0.5 s; 23 % SIGKILL of one of a bulk queue's two nodes (its process group), started again 2 s later;
30 % the broker stopped 2 s; 37 % the broker stopped while a running call ends, until its worker logs
"Couldn't ack" (a dropped ack); 46 % the lanes Redis stopped 5 s; 55 % FLUSHDB of the broker while calls
wait on its lists; 62 % the database read-only for 4 s (bench/soak_faults.read_only_database); 70 % both
redis-servers stopped 20 s; 90 % every API process stopped 1.5 s with Redis up (a starved host: no call
may go ahead `unavailable` outside the lanes Redis's fail-open windows). A fail-open window is [SIGSTOP - 0.2
s, SIGCONT + CAPACITY_REDIS_RETRY_SECONDS + 2 s] of each stall of the lanes Redis. The bound on a submission
during a stall is docs/api.md's: CAPACITY_REDIS_DEADLINE_SECONDS + CELERY_PUBLISH_DEADLINE_SECONDS + the
cache's timeout (1 s), plus 1.5 s for a loaded 2-core machine (as the fault tests allow).

The sampler (bench/soak_sampler.py) reads every lane's unexpired leases every 50 ms, skipping stalls of
the lanes Redis. After the load: drain (no message on the broker, no call queued or running), wait
lease_seconds + 1 s; then for each lane whose worker lost an ack, as many long calls as its pool has
processes are sent, and they must run at once. The checks and the report: bench/soak_report.py.
"""
import argparse
import os
import signal
import sys
import threading
import time
from collections import defaultdict

from helpers import lane_limit
from soak_faults import (
    CancelRace, drop_ack, duplicate_running, flush_broker, own_sessions_named, read_only_database, stall, starve_apis,
)
from soak_report import MIN_RACES, consuming_pools, report
from soak_sampler import Sampler, Watch
from stack import HOME, Stack

from devstack.processes import Child, stop_children, tail
from devstack.redis_server import RedisStartError, start_redis
from workers.lanes import QUEUE_NAMES, QUEUES

DEADLINE_SECONDS = 0.3
RETRY_SECONDS = 5
VISIBILITY_SECONDS = 70
QUEUE_DEADLINE_SECONDS = 30
MAX_HOLD_SECONDS = 30
LEASE_SECONDS = 15
RENEW_SECONDS = 5
SWEEP_SECONDS = 1
SWEEP_GRACE_SECONDS = 3
LATE_SECONDS = 3 * SWEEP_SECONDS  # a queued call this long past its deadline is one the sweep missed
WINDOW_MARGIN = 2.0
STALLS = ((0.17, 0.5, ('lanes', 'broker')), (0.30, 2.0, ('broker',)), (0.46, 5.0, ('lanes',)),
          (0.70, 20.0, ('lanes', 'broker')))  # (fraction of --seconds, seconds, which redis-servers)
API_STARVED = (0.9, 1.5)  # (fraction of --seconds, seconds): every API process stopped, Redis up
BULK_QUEUES = tuple(queue.name for queue in QUEUES if not queue.single_row)  # a node kill prefers these
SETTINGS = {'CAPACITY_REDIS_DEADLINE_SECONDS': DEADLINE_SECONDS, 'CAPACITY_REDIS_RETRY_SECONDS': RETRY_SECONDS,
            'CELERY_VISIBILITY_TIMEOUT': VISIBILITY_SECONDS, 'WORKERS_SWEEP_SECONDS': SWEEP_SECONDS,
            'WORKERS_SWEEP_GRACE_SECONDS': SWEEP_GRACE_SECONDS,
            # probe_pools sends long calls on purpose (1000 rows x limit 100): above the default answer bounds
            'MAX_MATCH_CANDIDATES': 100_000, 'MAX_ANSWER_BYTES': 512 * 1024 * 1024}


def start_broker():
    """A second private redis-server (broker + cache); returns (child, url)."""
    (HOME / 'log').mkdir(parents=True, exist_ok=True)
    try:
        return start_redis(HOME / 'log' / 'broker-redis.log', name='broker-redis', parent_pid=os.getpid())
    except RedisStartError as ex:
        sys.exit(f'the broker Redis did not start: {ex}')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seconds', type=float, default=180)
    parser.add_argument('--clients', type=int, default=16)
    parser.add_argument('--api-workers', type=int, default=1, help='processes of each of the two API servers')
    parser.add_argument('--terminology', default='tiny', choices=('tiny', 'hpo'))
    parser.add_argument('--max-backoff', type=float, default=3.0, help='cap on a user\'s wait after a 429')
    parser.add_argument('--drain-timeout', type=float, default=120.0)
    parser.add_argument('--seed', type=int, default=1)
    args = parser.parse_args()
    print('$', ' '.join([os.path.relpath(sys.executable), *sys.argv]), flush=True)

    broker, broker_url = start_broker()
    try:
        result = run(args, broker, broker_url)
    finally:
        stop_children([broker])
    sys.exit(0 if result else 1)


class Posts:
    """Every POST of the load: when it was sent, how long until its answer (or its failure), the status."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_key = defaultdict(list)  # Idempotency-Key -> [answer]
        self.timed = []  # (sent, took, status)

    def client_class(self, base):
        posts = self

        class RecordingClient(base):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                send = self.session.request

                def request(method, url, **kwargs):
                    sent = time.monotonic()
                    try:
                        response = send(method, url, **kwargs)
                    except Exception:
                        if method == 'POST':
                            posts.add((kwargs.get('headers') or {}).get('Idempotency-Key'), sent, None, None)
                        raise
                    if method == 'POST':
                        posts.add(response.request.headers.get('Idempotency-Key'), sent, response, None)
                    return response
                self.session.request = request
        return RecordingClient

    def add(self, key, sent, response, _):
        took = time.monotonic() - sent
        entry = {'status': response.status_code if response is not None else None, 'sent': sent, 'took': took}
        if response is not None:
            entry['retry_after'] = response.headers.get('Retry-After')
            entry['decision'] = response.headers.get('X-OCL-Capacity-Decision')
            if response.status_code in (429, 503):
                try:
                    entry['error_code'] = response.json().get('error_code')
                except ValueError:
                    entry['error_code'] = None
        with self.lock:
            self.by_key[key].append(entry)
            self.timed.append((sent, took, entry['status']))


def run(args, broker, broker_url):
    import redis
    env = {'CELERY_BROKER_URL': broker_url, 'CACHE_REDIS_URL': broker_url, **{k: str(v) for k, v in SETTINGS.items()}}
    config = {'mode': 'enforce', 'enforce_for': 'all', 'lease_seconds': LEASE_SECONDS, 'renew_seconds': RENEW_SECONDS,
              'queue': {'deadline_seconds': QUEUE_DEADLINE_SECONDS}, 'max_hold_seconds': MAX_HOLD_SECONDS}
    broker_client = redis.Redis.from_url(broker_url, socket_timeout=5)
    faults = {}
    hung = threading.Event()
    with Stack(api_workers=args.api_workers, terminology=args.terminology, config=config, env=env,
               api_servers=2, nodes_per_lane=2, maintenance=True) as stack:
        from capacity.config import get_config
        from django.conf import settings
        from django.contrib.auth import get_user_model

        import heavy_lanes_client.load as load
        from heavy_lanes_client.phrases import PHRASES
        from workers.models import Work

        own_sessions_named()
        cfg = get_config()
        assert cfg.mode == 'enforce' and cfg.lease_seconds == LEASE_SECONDS, cfg
        tokens = stack.tokens()['tokens']
        user_tier = {str(get_user_model().objects.get(username=row['username']).pk): row['tier'] for row in tokens}
        tag = '{' + settings.CAPACITY_KEY_PREFIX + '}:'

        def limit_of(key):
            return lane_limit(key, tag, cfg, user_tier)

        posts = Posts()
        load.Client = posts.client_class(load.Client)
        accounts = tuple(load.Account(row['tier'], row['token']) for row in tokens)
        generators = []
        for index, url in enumerate(stack.urls):
            users = args.clients // 2 + (args.clients % 2 if index == 0 else 0)
            plan = load.LoadPlan(url=url, accounts=accounts[index:] + accounts[:index], users=users,
                                 seconds=args.seconds, source=stack.source,
                                 drain_seconds=min(600.0, args.drain_timeout),
                                 max_backoff=args.max_backoff, seed=args.seed + index,
                                 submit_wait=False)  # the stall checks time POST -> answer, not -> result
            generators.append(load.LoadGenerator(plan))

        known = [tag + lane for lane in ('api_heavy', 'es2_knn')]
        known += [f'{tag}api_heavy_task:api-{letter}' for letter in 'ab']
        known += [f'{tag}tier:{tier}' for tier in cfg.tiers.names()] + [f'{tag}user:{pk}' for pk in user_tier]
        sampler = Sampler(stack.redis_url, tag, limit_of, known, hung)
        reports = {}
        threads = [threading.Thread(target=lambda g=g, i=i: reports.update({i: g.run()}), name=f'soak-load-{i}')
                   for i, g in enumerate(generators)]
        staff = next(row['token'] for row in tokens if row['tier'] == 'staff')
        races = [CancelRace([url], staff, stack.source, PHRASES) for url in stack.urls]
        watch = Watch(LATE_SECONDS)
        sampler.start()
        while sampler.started is None:
            time.sleep(0.01)
        t0 = sampler.started
        for thread in threads:
            thread.start()
        for race in races:
            race.start()
        watch.start()

        def at(fraction):
            time.sleep(max(0.0, t0 + fraction * args.seconds - time.monotonic()))

        def rel(moment):
            return round(moment - t0, 3)

        def say(name):
            print(f'[soak] t={faults[name].get("t", 0):.1f}s {name}: {faults[name]}', flush=True)

        def worker_groups():
            return {child.pid for queue in QUEUE_NAMES for child in stack.lane_children(queue)}

        def running_call(queues=QUEUE_NAMES, timeout=8.0):
            """A running call on one of `queues` whose worker pid is a pool process of a stack node."""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                for call in Work.objects.filter(state='running', queue__in=queues).exclude(worker=''):
                    _, _, pid = call.worker.rpartition(' pid ')
                    try:
                        pid = int(pid)
                        pgid = os.getpgid(pid)
                    except (ValueError, ProcessLookupError):
                        continue
                    if pgid in worker_groups() and pid != pgid:
                        return call, pid
                time.sleep(0.05)
            return None, None

        def child_of(call):
            """The node Child that runs `call` (from the row's `worker`, "<queue>@<letter>-<host> pid N")."""
            node = call.worker.rpartition(' pid ')[0]
            for name, prefix in stack.node_names(call.queue).items():
                if node.startswith(prefix):
                    return stack.children.get(name)
            return None

        def finished(call_id):
            return Work.objects.filter(pk=call_id).exclude(state__in=('queued', 'running')).exists()

        servers = {'lanes': stack.children['redis'].pid, 'broker': broker.pid}
        stalls = []

        def redis_stall(fraction, seconds, which):
            at(fraction)
            lanes = 'lanes' in which
            stopped, resumed = stall({name: servers[name] for name in which}, seconds,
                                     before=(lambda: (hung.set(), time.sleep(0.1))) if lanes else None,
                                     after=(lambda: (time.sleep(0.1), hung.clear())) if lanes else None)
            entry = {'seconds': seconds, 'redis': list(which), 'sigstop_t': rel(stopped), 'sigcont_t': rel(resumed)}
            if lanes:
                entry['fail_open_window'] = [rel(stopped - 0.2), rel(resumed + RETRY_SECONDS + WINDOW_MARGIN)]
            stalls.append(entry)
            print(f'[soak] t={entry["sigstop_t"]:.1f}s Redis stall: {entry}', flush=True)

        # A duplicate message of a running call.
        at(0.06)
        faults['duplicate_message'] = {'t': rel(time.monotonic()), **duplicate_running(
            broker_client, lambda call: call.queue, lambda timeout: running_call(timeout=timeout))}
        say('duplicate_message')

        # SIGKILL the pool process running a call.
        at(0.12)
        call, pid = running_call()
        faults['pool_kill'] = {'t': rel(time.monotonic()), 'call': call and call.pk}
        if call is not None:
            os.kill(pid, signal.SIGKILL)
            faults['pool_kill'].update(lane=call.queue, pid=pid, worker=call.worker)
        say('pool_kill')

        redis_stall(*STALLS[0])

        # SIGKILL one of a (bulk, preferably busy) queue's two nodes, start it again 2 s later.
        at(0.23)
        call, _ = running_call(BULK_QUEUES, timeout=5.0)
        old = (call and child_of(call)) or stack.lane_children('es2_knn')[0]
        queue = next(q for q in QUEUE_NAMES if old in stack.lane_children(q))
        running_there = list(Work.objects.filter(state='running', queue=queue, worker__startswith=stack.node_names(
            queue)[old.name]).values_list('id', flat=True))
        old.signal_group(signal.SIGKILL)
        killed_at = rel(time.monotonic())
        old.process.wait(10)
        deadline = time.monotonic() + 10
        while old.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
        log_path = stack.logs / f'{old.name}-restarted.log'
        new = Child(old.name, old.argv, log_path, ready=lambda: ' ready.' in tail(log_path, 400))
        stack._start(new)
        deadline = time.monotonic() + 60
        while not new.check_ready() and time.monotonic() < deadline and new.running():
            time.sleep(0.1)
        faults['node_kill'] = {'t': killed_at, 'node': old.name, 'queue': queue, 'running_calls': running_there,
                               'restarted_t': rel(time.monotonic()), 'ready': new.is_ready}
        say('node_kill')

        redis_stall(*STALLS[1])

        # A dropped ack: the broker stopped while a running es2_knn call ends.
        at(0.37)
        dropped = drop_ack(servers['broker'], lambda timeout: running_call(('es2_knn',), timeout),
                           lambda call: (child := child_of(call)) and child.log_path, finished)
        if dropped.get('stall'):
            stopped, resumed = dropped.pop('stall')
            dropped.update(sigstop_t=rel(stopped), sigcont_t=rel(resumed))
            stalls.append({'seconds': round(resumed - stopped, 3), 'redis': ['broker'], 'sigstop_t': rel(stopped),
                           'sigcont_t': rel(resumed), 'fault': 'dropped ack'})
        faults['dropped_ack'] = {'t': dropped.get('sigstop_t', rel(time.monotonic())), **dropped}
        say('dropped_ack')

        redis_stall(*STALLS[2])

        # FLUSHDB of the broker under queued calls.
        at(0.55)
        flushed = flush_broker(broker_client, lambda: list(Work.objects.filter(state='queued').values_list(
            'pk', flat=True)))
        faults['broker_flushed'] = {'t': rel(time.monotonic()), **flushed}
        say('broker_flushed')

        # The database read-only for a few seconds.
        at(0.62)
        start, end, ended = read_only_database(4.0)
        faults['read_only_database'] = {'t': rel(start), 'end_t': rel(end), 'sessions_ended': ended}
        say('read_only_database')

        redis_stall(*STALLS[3])

        # Every API process stopped past the limiter's deadline with Redis answering: a starved host.
        at(API_STARVED[0])
        faults['api_starved'] = starve_apis(stack, API_STARVED[1], rel)
        say('api_starved')

        at(0.95)
        deadline = time.monotonic() + 60  # the races go on past the load until there were MIN_RACES of them
        while sum(len(race.races) for race in races) < MIN_RACES and time.monotonic() < deadline:
            time.sleep(0.2)
        for race in races:
            race.stop()
        for thread in threads:
            thread.join()
        load_done = rel(time.monotonic())
        # Drain: no message on the broker (waiting or unacked), no call queued or running.
        from workers import messages
        drain_deadline = time.monotonic() + args.drain_timeout
        drained = False
        while time.monotonic() < drain_deadline:
            if not messages.present(QUEUE_NAMES, broker_client) and not Work.objects.filter(
                    state__in=('queued', 'running')).exists():
                drained = True
                break
            time.sleep(0.2)
        drained_t = rel(time.monotonic())
        time.sleep(LEASE_SECONDS + 1)
        sampler.stop()
        leases_left = {key[len(tag):]: n for key, n in stack.in_flight().items() if n}
        members_left = {key[len(tag):]: n for key in stack.lane_keys() if (n := stack.redis.zcard(key))}
        probes = probe_pools(stack, staff, lanes_with_lost_acks(stack))
        watch.stop()
        return report(args, stack=stack, tag=tag, limit_of=limit_of, cfg=cfg, faults=faults, stalls=stalls,
                      generators=generators, posts=posts, races=races, watch=watch, sampler=sampler,
                      broker_client=broker_client, load_done=load_done, drained=drained, drained_t=drained_t,
                      leases_left=leases_left, members_left=members_left, probes=probes, settings=SETTINGS,
                      lease_seconds=LEASE_SECONDS, late_seconds=LATE_SECONDS, retry_seconds=RETRY_SECONDS)


def lanes_with_lost_acks(stack):
    """The lane queues of the nodes that say they lost an acknowledgement (acks_failed_total, published by
    their reconcilers for /capacity/status/)."""
    from workers.pool import read_pools
    return [queue for queue in QUEUE_NAMES
            if any(pool.get('acks_failed_total', 0) for pool in read_pools(stack.redis, queue).values())]


def probe_pools(stack, token, queues, timeout=90):
    """For each of `queues`: send as many long calls as its pool has processes and see how many run at
    once, from the rows' start and end (they must all: no prefetch slot lost). {queue: {pool, at_once, ...}}."""
    import requests

    from workers.models import Work
    from workers.pool import read_pools
    rows = [{'name': f'high blood pressure with chest pain and fever, probe {i}'} for i in range(1000)]
    params = {'interactive': {'semantic': 'true'}, 'es2_knn': {'semantic': 'true', 'reranker': 'true', 'limit': '100'},
              'api_heavy': {'reranker': 'true', 'limit': '100'}}
    out = {}
    for queue in queues:
        pool = consuming_pools({queue: read_pools(stack.redis, queue)})[queue]
        body_rows = rows[:1] if queue == 'interactive' else rows
        ids = []
        for n in range(pool):
            response = requests.post(f'{stack.urls[n % len(stack.urls)]}/concepts/$match/', params=params[queue],
                                     json={'rows': [{'name': f'{body_rows[0]["name"]} {queue} {n}'}] + body_rows[1:],
                                           'target_repo_url': stack.source},
                                     headers={'Authorization': f'Token {token}', 'Prefer': 'respond-async'},
                                     timeout=30)
            if response.status_code == 202:
                ids.append(response.json()['id'])
        deadline = time.monotonic() + timeout
        while ids and time.monotonic() < deadline and Work.objects.filter(pk__in=ids).filter(
                state__in=('queued', 'running')).exists():
            time.sleep(0.1)
        spans = list(Work.objects.filter(pk__in=ids).values_list('state', 'started_at', 'finished_at'))
        # How many ran at once: the most runs whose [started_at, finished_at] hold one moment.
        at_once = max((sum(1 for _, s, f in spans if s and f and s <= start < f) for _, start, _ in spans if start),
                      default=0)
        out[queue] = {'pool': pool, 'sent': len(ids), 'at_once': at_once, 'states': [state for state, _, _ in spans],
                      'ids': ids}
    return out


if __name__ == '__main__':
    main()
