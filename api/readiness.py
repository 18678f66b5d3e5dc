"""GET /readyz: whether this API host can take heavy calls now, check by check: its own fitness only.

- `database`: this process's connection answers and takes writes (not a read-only server, a standby, or a
  read-only SQLite file): a call is a row written before its message goes out;
- `lanes`: the lane store answers PING (its probe: through its own thread and deadline, the skip window
  notwithstanding);
- `broker`: the Celery broker answers PING (a call couldn't be published without it).

Beside the checks, `cluster.consumers` says which lane queues that aren't paused have no live node consuming
them, as the nodes' pool reconcilers last published (workers.pool): a node counts while it published within
READY_STALE_FACTOR x WORKERS_RECONCILE_SECONDS. That is a fact about the cluster, not this host: every API
host would report it at once, so it never fails readiness (a load balancer would take every host out,
lexical calls included, while a worker service is redeployed); it is an alert (HeavyLanesNoConsumers) and a
field of /capacity/status/.

/healthz stays the cheap liveness probe (the process and its database); this one costs three Redis round
trips and two small reads, each bounded by its client's timeouts. It answers 200 or 503 with every check, so
a load balancer or an operator sees which one failed; an error is named by its class only (no host names).
"""
import logging

import redis
from django.conf import settings
from django.db import connection

from capacity.config import get_config
from capacity.store import get_store
from common import connections
from workers import lanes
from workers.pool import read_pools

logger = logging.getLogger('heavy_lanes')
OK = 'ok'
READY_STALE_FACTOR = 1.5  # a node silent for 1.5 reconcile intervals is taken for gone (15 s by default)


READ_ONLY = 'ReadOnly'


def check_database():
    """None when this process's connection answers and its writes would be taken, else why not."""
    with connection.cursor() as cursor:
        if connection.vendor == 'postgresql':
            cursor.execute("SELECT current_setting('transaction_read_only'), pg_is_in_recovery()")
            read_only, standby = cursor.fetchone()
            return READ_ONLY if read_only == 'on' or standby else None
        if connection.vendor == 'sqlite':
            cursor.execute('PRAGMA query_only')
            return READ_ONLY if cursor.fetchone()[0] else None
        cursor.execute('SELECT 1')
    return None


def check_lanes():
    """None when the lane store answers PING, else the error's class name."""
    answered = get_store().probe()
    return None if answered else answered.error.split(':', 1)[0]


def check_broker():
    """Raises when the broker doesn't answer PING, asked twice: a pooled connection the server lost meanwhile
    fails its first write (the cluster run saw `Error 32 while writing to socket. Broken pipe.` on an API host
    whose link had come back), and a probe that failed on that alone would take a fit host out of its load
    balancer for a probe interval. The second ask is on a new connection; PING is safe to repeat."""
    client = connections.connect('status', settings.CELERY_BROKER_URL)
    try:
        client.ping()
    except redis.ConnectionError:
        client.connection_pool.disconnect(inuse_connections=False)
        client.ping()


def live_consumers(queue):
    """The nodes consuming `queue` that published their pool recently enough (by Redis's clock) to be alive."""
    fresh = READY_STALE_FACTOR * settings.WORKERS_RECONCILE_SECONDS
    pools = read_pools(connections.connect('status'), queue)
    return sorted(node for node, pool in pools.items() if pool.get('consuming') and pool['age'] <= fresh)


def check_consumers(config):
    """None when every lane that isn't paused has a consumer, else what is missing."""
    missing = [queue.name for queue in lanes.QUEUES
               if queue.pool_size(config) > 0 and not live_consumers(queue.name)]
    if missing:
        return f'no consumer for {", ".join(missing)}'
    return None


def run_checks():
    """(ready, {check: 'ok' or what failed}, {fact about the cluster: 'ok' or what is wrong})."""
    checks = {}
    for name, check in (('database', check_database), ('lanes', check_lanes), ('broker', check_broker)):
        try:
            checks[name] = check() or OK
        except Exception as ex:  # noqa: BLE001 - a failed check is the answer, not an error
            checks[name] = type(ex).__name__
            # The answer names the class only; the log keeps the message, for the operator who asks why.
            logger.warning('Readiness check %s failed: %s: %s', name, type(ex).__name__, ex)
    try:
        cluster = {'consumers': check_consumers(get_config()) or OK}
    except Exception as ex:  # noqa: BLE001 - a fact it couldn't read is said, and never fails readiness
        cluster = {'consumers': type(ex).__name__}
    return all(value == OK for value in checks.values()), checks, cluster
