"""One cluster run: bring the shape up, put it under load, inject each fault in turn, check, report.

Runs inside the client host's namespace (after `Network.create()`, the harness moves itself there), so
everything it reads — the proxy, each API host's /readyz, PostgreSQL, the Sentinels — it reads over the
bridge, as a client would.
"""
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from cluster import checks, floor, measure, planted
from cluster.faults import FAULTS
from cluster.hosts import API_HOSTS, WORKER_HOSTS, Cluster
from cluster.load import Load

LEASE_SECONDS, RENEW_SECONDS = 15, 5
USERS = 6
# docs/api.md: a submission's worst case is the limiter's deadline plus the publish deadline (3 s); the
# failover adds the Sentinels' detection (down-after 2 s) to a publish waiting for the new primary.
LATENCY_BOUND = 10.0
PLANNED = ('rolling-restart', 'worker-host-drained', 'worker-clock-ahead')  # restarts an operator makes


@dataclass
class Outcome:
    fault: str
    seconds: float
    checks: list = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    planted: list = field(default_factory=list)  # cluster.planted.Plant: the checks again, each with a violation

    @property
    def passed(self):
        return all(check.passed for check in self.checks)


def prepare(cluster):
    """Migrate, load the tiny source and build its indexes, make the load's users and a staff user, and set the
    lanes as the run needs them (enforce for everyone, short leases): in the harness, over the bridge."""
    env = cluster.app_env('client')
    env.pop('HEAVY_LANES_PRODUCTION')
    os.environ.update(env)
    import django
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from rest_framework.authtoken.models import Token

    from concepts.matching import store
    from concepts.models import Source
    from concepts.services import embedder_name
    call_command('migrate', '--noinput', verbosity=0)
    call_command('collectstatic', '--noinput', verbosity=0)  # as the image does when it is built
    call_command('load_terminology', 'tiny', verbosity=0)
    for source in Source.objects.all():
        store.build_missing(source, embedder_name())
    core = Group.objects.get_or_create(name='core_user')[0]
    tokens = []
    for n in range(USERS):
        user = User.objects.create_user(f'client{n}')
        user.groups.add(core)
        tokens.append(Token.objects.create(user=user).key)
    staff = User.objects.create_user('ops', is_staff=True)
    cluster.staff_token = Token.objects.create(user=staff).key
    cluster.tokens = tokens
    call_command('capacity', 'set', 'mode=enforce', 'enforce_for=all', f'lease_seconds={LEASE_SECONDS}',
                 f'renew_seconds={RENEW_SECONDS}', '--note', 'the cluster harness', verbosity=0)


def status_of(cluster):
    import requests
    try:
        return requests.get(f'{cluster.proxy_url}/capacity/status/', timeout=10,
                            headers={'Authorization': f'Token {cluster.staff_token}'}).json()
    except (requests.RequestException, ValueError):
        return None


def readyz(cluster):
    """One read of each API host's /readyz: (host, status, sent, answered), 0 for no answer."""
    import requests
    reads = []
    for host in API_HOSTS:
        sent = time.time()
        try:
            answer = requests.get(f'http://{cluster.addr(host)}:8000/readyz', timeout=3)
            status = answer.status_code
            if status == 503:  # say which check failed: '503 broker=TimeoutError'
                failed = {k: v for k, v in (answer.json().get('checks') or {}).items() if v != 'ok'}
                status = '503 ' + ','.join(f'{k}={v}' for k, v in failed.items())
        except (requests.RequestException, ValueError):
            status = 0
        reads.append((host, status, sent, time.time()))
    return reads


class Watch:
    """Each API host's /readyz read every second while a fault plays out and the load runs on after it."""

    def __init__(self, cluster):
        self.cluster, self.reads, self.stopping = cluster, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name='readyz')

    def run(self):
        while not self.stopping.wait(1):
            self.reads += readyz(self.cluster)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(10)


def lines_of(cluster):
    """The worker hosts' lines of each run's start and end (workers.execution.RunLine), from every log their
    processes wrote this run (a restarted host's earlier logs included: Cluster.start keeps them)."""
    out = []
    for host in WORKER_HOSTS:
        for log in (cluster.dir / 'logs').glob(f'{host}-*.log*'):
            for text in log.read_text(errors='replace').splitlines():
                if text.startswith('{') and '"run": {' in text:
                    try:
                        out.append(json.loads(text))
                    except ValueError:
                        continue  # half a line: its process was killed while writing it
    return out


def works_ran(since):
    """Works that ran to an end (succeeded or failed) since `since` (time.time())."""
    from datetime import UTC, datetime

    from workers.models import Work
    return Work.objects.filter(started_at__gte=datetime.fromtimestamp(since, UTC),
                               state__in=('succeeded', 'failed')).count()


def lanes_client():
    from common import connections
    connections.forget()
    return connections.build('lanes')


def one_fault(cluster, load, name, warm, after):
    started = time.time()
    load.start()
    time.sleep(warm)
    with Watch(cluster) as watch:
        effect = FAULTS[name](cluster)
        time.sleep(after)
    load.stop()
    submissions = load.handles(since=started)
    outcome = Outcome(name, 0)
    from django.db import connection
    connection.close()  # the fault may have ended it (a database restart)
    final, calls = checks.wait_final(submissions, timeout=120)
    outcome.checks.append(final)
    outcome.checks.append(checks.cancelled_only_when_asked(submissions, calls))
    runs = checks.runs_of(lines_of(cluster))
    outcome.checks.append(checks.runs_once(calls, runs, effect.killed, effect.cut_off))
    ends = [call.work.finished_at.timestamp() for call in calls.values() if call.work.finished_at]
    last_end = min(max(ends, default=time.time()), time.time())  # a host with its clock ahead wrote some
    outcome.checks.append(checks.leases_back(lanes_client(), os.environ.get('CAPACITY_KEY_PREFIX', 'ocl:capacity'),
                                             last_end, LEASE_SECONDS + RENEW_SECONDS, timeout=60))
    outcome.checks.append(checks.lanes_within_limits(calls, effect.failover, effect.clock_ahead))
    outcome.checks.append(checks.pools_sum(lambda: status_of(cluster)))
    all_sent = [s for s in load.submissions if s.sent >= started]
    if effect.failover:  # the bound is the failover's; other faults report their latency below
        outcome.checks.append(checks.latency(all_sent, LATENCY_BOUND))
    if name in PLANNED:
        outcome.checks.append(checks.planned_restart_loses_no_request(all_sent))
    final_reads = readyz(cluster)
    outcome.checks.append(checks.readiness(watch.reads, final_reads, effect.unready, effect.down))
    outcome.planted = planted.plant(calls, runs, effect, watch.reads, final_reads)
    statuses = {}
    for s in all_sent:
        key = str(s.status or s.error)
        statuses[key] = statuses.get(key, 0) + 1
    took = sorted(s.took for s in all_sent if s.kind == 'polling')
    outcome.figures = {'submissions': statuses, 'handles': len(submissions),
                       'async submission max s': round(took[-1], 2) if took else None,
                       'started twice': sum(1 for c in calls.values() if c.work.attempts > 1),
                       'failover window s': round(effect.failover[1] - effect.failover[0], 1) if effect.failover
                       else None}
    outcome.seconds = time.time() - started
    return outcome


def run(workdir, faults, say=print, warm=10, after=15, measure_cost=True, compare_floor=True):
    cluster = Cluster(workdir)
    outcomes = []
    began = time.time()
    try:
        cluster.net.create()
        cluster.net.enter('client')
        cluster.up(lambda: prepare(cluster))
        say(f'cluster up in {time.time() - began:.0f} s')
        load = Load(cluster.proxy_url, cluster.tokens)
        if measure_cost:
            cluster.figures = measure.per_call(lanes_client(), load, works_ran)
            load.submissions.clear()
            say(f'Redis per call: {cluster.figures}')
        for name in faults:
            outcome = one_fault(cluster, load, name, warm=warm, after=after)
            load.submissions.clear()
            outcomes.append(outcome)
            say(f'{name}: {"PASS" if outcome.passed else "FAIL"} in {outcome.seconds:.0f} s')
            for check in outcome.checks:
                say(f'    {"PASS" if check.passed else "FAIL"} {check.name}: {check.detail}')
            for plant in outcome.planted:
                say(f'    planted in {plant.check!r}: {plant.what}: '
                    f'{ {True: "caught", False: "MISSED", None: "nothing to plant in"}[plant.caught] }')
        floor_faults = [name for name in floor.FAULT_STEPS if name in faults]
        if compare_floor and floor_faults:
            cluster.floor = floor.compare(cluster, floor_faults)
            say(f'plain Celery (published, vanished, refused): {cluster.floor}')
    finally:
        cluster.down()
    return outcomes, time.time() - began, {**getattr(cluster, 'figures', {}), 'floor': getattr(cluster, 'floor', {})}


if __name__ == '__main__':
    sys.exit('python -m cluster')
