"""The faults, each a function of the running `Cluster` that injects it, keeps it for a while under load and
puts the host back as an operator (or an orchestrator) would. Each returns what the checks need to know, as
measured here: which worker host was killed or cut off and when (a work may then run again), the Redis
failover's window (the lanes fail open in it: docs/deployment.md), and when each API host was out by its
own fault (its /readyz may say anything then) or down (it must not say 200)."""
import signal
import time
from dataclasses import dataclass, field

from cluster.hosts import API_HOSTS, wait_for

PROXY_FAIL_TIMEOUT = 10  # deploy/nginx.conf: max_fails=3 fail_timeout=10s
BREAKER_PROBE_SECONDS = 0.5  # CAPACITY_REDIS_PROBE_SECONDS (api/settings.py), which the harness leaves as it is


@dataclass
class Effect:
    """What a fault did, as the harness measured it (epoch seconds, time.time())."""

    killed: dict = field(default_factory=dict)   # {worker host: when its processes were SIGKILLed}
    cut_off: dict = field(default_factory=dict)  # {worker host: when its link went down}
    failover: tuple = ()  # (from, to): the old primary lost, until every API host reached the new one
    unready: list = field(default_factory=list)  # (API host, from, to): its /readyz may say anything then
    down: list = field(default_factory=list)     # (API host, from, to): its /readyz must not say 200 then
    clock_ahead: dict = None  # {host: seconds} of a host whose clock ran ahead


def _new_primary(cluster, old, timeout=40):
    wait_for(lambda: cluster.primary() not in (None, old), timeout, 'the Sentinels to promote a replica',
             interval=0.1)
    return cluster.primary()


def ready_again(cluster, hosts, timeout=60):
    """When every one of `hosts` answered its /readyz 200, polled from now (or the deadline, when one never
    did: the readiness check then fails on its reads)."""
    waiting, deadline = set(hosts), time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        waiting = {host for host in waiting if not cluster.api_ready(host, '/readyz')}
        if waiting:
            time.sleep(0.2)
    return time.time()


def failover_window(cluster, lost, old):
    """The failover's window, measured: from `lost` (the old primary stopped answering as one) until the
    Sentinels named a new primary and every API host's /readyz answered 200 again (its lane store and broker
    reached it through the Sentinels), plus one probe interval of the limiter's breaker (a process in its
    skip window counts again at its probe's next PING: docs/architecture.md). (window, new primary, when
    the Sentinels named it)."""
    new = _new_primary(cluster, old)
    promoted = time.time()
    reconnected = ready_again(cluster, API_HOSTS, timeout=30)
    return (lost, reconnected + BREAKER_PROBE_SECONDS), new, promoted


def sentinel_kill_primary(cluster):
    old = cluster.primary()
    lost = time.time()
    cluster.children[(old, 'redis')].kill()
    window, new, promoted = failover_window(cluster, lost, old)
    time.sleep(max(0.0, promoted + 5 - time.time()))
    cluster.start_redis(old, replica_of=new)  # it comes back as a replica of the new primary
    return Effect(failover=window, unready=[(host, *window) for host in API_HOSTS])


def sentinel_failover(cluster):
    old = cluster.primary()
    lost = time.time()
    cluster.redis_cli('redis3', 'SENTINEL', 'FAILOVER', 'mymaster', port=26379)
    window, _new, promoted = failover_window(cluster, lost, old)
    time.sleep(max(0.0, promoted + 10 - time.time()))
    return Effect(failover=window, unready=[(host, *window) for host in API_HOSTS])


def worker_host_killed(cluster):
    cluster.kill_host('worker1')
    killed = time.time()  # after: a run that began while the signals went out began before its death
    time.sleep(10)
    cluster.start_workers('worker1')
    return Effect(killed={'worker1': killed})


def api_host_killed(cluster):
    killing = time.time()
    cluster.kill_host('api1')
    killed = time.time()
    time.sleep(5)
    started = time.time()
    cluster.start_api('api1')  # a container restart: the same host, a new process
    wait_for(lambda: cluster.api_ready('api1'), 60, 'api1 back')
    back = ready_again(cluster, ['api1'])
    return Effect(unready=[('api1', killing, back)], down=[('api1', killed, started)])


def rolling_restart(cluster):
    unready = []
    for host in API_HOSTS:
        stopping = time.time()
        cluster.stop_host(host, seconds=35)  # compose's stop_grace_period
        cluster.start_api(host)
        wait_for(lambda host=host: cluster.api_ready(host, '/readyz'), 60, f'{host} ready again')
        unready.append((host, stopping, time.time()))
        # nginx took the host out for fail_timeout (10 s) when its connections were refused: stopping the
        # next one before then leaves no upstream (docs/deployment.md, "Rolling restart").
        time.sleep(PROXY_FAIL_TIMEOUT + 1)
    return Effect(unready=unready)


def worker_host_drained(cluster):
    cluster.stop_host('worker2', seconds=60)  # warm shutdown: the calls in progress end first
    time.sleep(5)
    cluster.start_workers('worker2')
    return Effect()


def worker_host_cut_off(cluster):
    cluster.net.link('worker1', up=False)
    cut = time.time()  # after: a run that began while `ip` ran began before the cut
    time.sleep(30)
    cluster.net.link('worker1', up=True)
    return Effect(cut_off={'worker1': cut})  # to the cluster it was dead: its calls were taken over


def api_host_cut_off(cluster):
    cutting = time.time()
    cluster.net.link('api2', up=False)
    cut = time.time()
    time.sleep(30)
    relinking = time.time()
    cluster.net.link('api2', up=True)
    back = ready_again(cluster, ['api2'])
    return Effect(unready=[('api2', cutting, back)], down=[('api2', cut, relinking)])


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
    stopping = time.time()
    cluster.children[('db', 'postgres')].stop_signal = signal.SIGINT  # fast shutdown: ends every connection
    cluster.stop_host('db', seconds=30)
    stopped = time.time()
    time.sleep(5)
    up = time.time()  # before the start: from here the database may answer
    cluster.start_database()
    back = ready_again(cluster, API_HOSTS)
    return Effect(unready=[(host, stopping, back) for host in API_HOSTS],
                  down=[(host, stopped, up) for host in API_HOSTS])


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
