"""The faults, each a function of the running `Cluster` that injects it, keeps it for a while under load and
puts the host back as an operator (or an orchestrator) would. Each returns what the checks need to know:
whether a node died mid-run (a work may then run twice) and whether Redis failed over (the lanes fail open
for a moment: docs/operations.md)."""
import signal
import time
from dataclasses import dataclass

from cluster.hosts import API_HOSTS, wait_for

PROXY_FAIL_TIMEOUT = 10  # deploy/nginx.conf: max_fails=3 fail_timeout=10s


@dataclass
class Effect:
    node_died: bool = False
    fail_open: bool = False
    database_down: tuple = ()  # (from, to) time.time() while PostgreSQL was down
    clock_ahead: dict = None  # {host: seconds} of a host whose clock ran ahead


def _new_primary(cluster, old, timeout=40):
    wait_for(lambda: cluster.primary() not in (None, old), timeout, 'the Sentinels to promote a replica')
    return cluster.primary()


def sentinel_kill_primary(cluster):
    old = cluster.primary()
    cluster.children[(old, 'redis')].kill()
    new = _new_primary(cluster, old)
    time.sleep(5)
    cluster.start_redis(old, replica_of=new)  # it comes back as a replica of the new primary
    return Effect(fail_open=True)


def sentinel_failover(cluster):
    old = cluster.primary()
    cluster.redis_cli('redis3', 'SENTINEL', 'FAILOVER', 'mymaster', port=26379)
    _new_primary(cluster, old)
    time.sleep(10)
    return Effect(fail_open=True)


def worker_host_killed(cluster):
    cluster.kill_host('worker1')
    time.sleep(10)
    cluster.start_workers('worker1')
    return Effect(node_died=True)


def api_host_killed(cluster):
    cluster.kill_host('api1')
    time.sleep(5)
    cluster.start_api('api1')  # a container restart: the same host, a new process
    wait_for(lambda: cluster.api_ready('api1'), 60, 'api1 back')
    return Effect()


def rolling_restart(cluster):
    for host in API_HOSTS:
        cluster.stop_host(host, seconds=35)  # compose's stop_grace_period
        cluster.start_api(host)
        wait_for(lambda host=host: cluster.api_ready(host, '/readyz'), 60, f'{host} ready again')
        # nginx took the host out for fail_timeout (10 s) when its connections were refused: stopping the
        # next one before then leaves no upstream (docs/deployment.md, "Rolling restart").
        time.sleep(PROXY_FAIL_TIMEOUT + 1)
    return Effect()


def worker_host_drained(cluster):
    cluster.stop_host('worker2', seconds=60)  # warm shutdown: the calls in progress end first
    time.sleep(5)
    cluster.start_workers('worker2')
    return Effect()


def worker_host_cut_off(cluster):
    cluster.net.link('worker1', up=False)
    time.sleep(30)
    cluster.net.link('worker1', up=True)
    return Effect(node_died=True)  # to the cluster it was dead: its calls were taken over


def api_host_cut_off(cluster):
    cluster.net.link('api2', up=False)
    time.sleep(30)
    cluster.net.link('api2', up=True)
    return Effect()


def worker_clock_ahead(cluster):
    cluster.stop_host('worker2', seconds=60)
    cluster.faketime['worker2'] = '+30s'
    cluster.start_workers('worker2')
    time.sleep(40)
    cluster.stop_host('worker2', seconds=60)
    cluster.faketime.pop('worker2')
    cluster.start_workers('worker2')
    return Effect(clock_ahead={'worker2': 30})


def database_restarted(cluster):
    down = time.time()
    cluster.children[('db', 'postgres')].stop_signal = signal.SIGINT  # fast shutdown: ends every connection
    cluster.stop_host('db', seconds=30)
    time.sleep(5)
    up = time.time()
    cluster.start_database()
    return Effect(database_down=(down, up))


FAULTS = {
    'sentinel-kill-primary': sentinel_kill_primary,
    'worker-host-killed': worker_host_killed,
    'api-host-killed': api_host_killed,
    'database-restarted': database_restarted,
    'sentinel-failover': sentinel_failover,
    'rolling-restart': rolling_restart,
    'worker-host-drained': worker_host_drained,
    'worker-host-cut-off': worker_host_cut_off,
    'api-host-cut-off': api_host_cut_off,
    'worker-clock-ahead': worker_clock_ahead,
}
SHORT = ('worker-host-killed', 'sentinel-kill-primary')
