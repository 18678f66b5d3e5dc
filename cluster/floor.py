"""Plain Celery beside Heavy Lanes (docs/cluster.md, "Plain Celery"): the same host kill and Sentinel failover
against a client of the `delay()` floor view (api/bench_views.py: the body validated, then
`apply_async()` on the lane's queue and a 202 with the task id; no row, no lease, no sweep). Its calls are
counted as vanished when no result is stored a minute after the load stopped.

Run last: it stops the lane nodes (they don't know the floor's task) and starts on each worker host a node
that does (`--include api.bench_views`), and on api1 a second gunicorn on port 8001 with the floor views on
(they are never on in production settings, so this one runs without them; the same database, Redis and
Sentinels).
"""
import random
import threading
import time

import requests

from cluster.hosts import PYTHON, WORKER_HOSTS, wait_for
from cluster.load import SOURCE, TERMS

FLOOR_PORT = 8001


def start(cluster):
    for host in WORKER_HOSTS:
        cluster.stop_host(host, seconds=60)
        start_nodes(cluster, host)
    env = cluster.app_env('api1')
    env.pop('HEAVY_LANES_PRODUCTION')
    env['HEAVY_LANES_BENCH_VIEWS'] = 'true'
    cluster.start('api1', 'floor', [PYTHON, '-m', 'gunicorn', '-c', 'python:api.gunicorn_config',
                                    'api.wsgi:application', '--bind', f'0.0.0.0:{FLOOR_PORT}'], env=env)
    wait_for(lambda: cluster.http('client', f'http://{cluster.addr("api1")}:{FLOOR_PORT}/healthz')[0] == 200,
             60, 'the floor API')


def start_nodes(cluster, host):
    cluster.start(host, 'floor', [PYTHON, '-m', 'celery', '-A', 'workers', 'worker', '-Q', 'interactive,es2_knn',
                                  '-n', 'floor@%h', '-P', 'prefork', '-c', '2', '--include', 'api.bench_views',
                                  '--without-gossip', '--without-mingle', '-l', 'INFO'])


class FloorLoad:
    def __init__(self, url, tokens, clients=4, bulk_rows=1000):
        self.url, self.tokens, self.clients, self.bulk_rows = url, tokens, clients, bulk_rows
        self.ids, self.failed, self.stopping = [], 0, threading.Event()
        self.threads = []

    def start(self):
        self.stopping.clear()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(self.clients)]
        for thread in self.threads:
            thread.start()

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)

    def run(self, index):
        chooser, session, n = random.Random(index), requests.Session(), 0
        while not self.stopping.is_set():
            n += 1
            rows = 1 if n % 2 else self.bulk_rows
            body = {'rows': [{'name': f'{chooser.choice(TERMS)} {chooser.randrange(10**6)}'} for _ in range(rows)],
                    'target_repo_url': SOURCE}
            try:
                answer = session.post(f'{self.url}/bench/delay/?semantic=true', json=body, timeout=30,
                                      headers={'Authorization': f'Token {self.tokens[index % len(self.tokens)]}'})
                if answer.status_code == 202:
                    self.ids.append(answer.json()['id'])
                else:
                    self.failed += 1
            except requests.RequestException:
                self.failed += 1
            self.stopping.wait(0.5)


def vanished(ids, wait_seconds=60):
    """The ids with no stored success `wait_seconds` after the load stopped (checked every second, done early
    when all have one)."""
    from django.db import connection
    from django_celery_results.models import TaskResult
    connection.close()
    deadline = time.monotonic() + wait_seconds
    while True:
        done = set(TaskResult.objects.filter(task_id__in=ids, status='SUCCESS').values_list('task_id', flat=True))
        missing = [task_id for task_id in ids if task_id not in done]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(1)


def compare(cluster, faults):
    """{fault: (published, vanished, refused)} for the floor under each of `faults` (names in FAULT_STEPS)."""
    start(cluster)
    results = {}
    for name in faults:
        load = FloorLoad(f'http://{cluster.addr("api1")}:{FLOOR_PORT}', cluster.tokens)
        load.start()
        time.sleep(10)
        FAULT_STEPS[name](cluster)
        time.sleep(15)
        load.stop()
        results[name] = (len(load.ids), len(vanished(load.ids)), load.failed)
    return results


def kill_worker_host(cluster):
    cluster.kill_host('worker1')
    time.sleep(10)
    start_nodes(cluster, 'worker1')


def kill_primary(cluster):
    from cluster.faults import sentinel_kill_primary
    sentinel_kill_primary(cluster)


FAULT_STEPS = {'worker-host-killed': kill_worker_host, 'sentinel-kill-primary': kill_primary}
