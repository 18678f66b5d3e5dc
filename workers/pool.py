"""Size each lane worker's pool from the capacity config, across every node that serves the lane.

A lane's pool size (workers.lanes) is split over the live nodes consuming its queue so that the total
equals it: nodes sorted by name, the first `size % n` get one more. Each node runs a PoolReconciler thread
in its main process (started when the worker is ready) that, every WORKERS_RECONCILE_SECONDS:
1. refreshes its heartbeat in the lane's node set (a sorted set scored by expiry, like the leases);
2. computes its share from the config and the live nodes;
3. when the share changed since it last applied one, resizes through Celery's own control commands
   (pool_grow / pool_shrink, add_consumer / cancel_consumer) addressed to itself; a share of 0 (the lane
   paused, or more nodes than slots) stops consuming the queue, so its calls wait and expire;
4. publishes what it wants and what it has (share, pool processes, consuming) for /capacity/status/.
A hand resize (Flower, `celery control pool_grow`) is left alone, and shows as drift, until the share
changes again. Resizing needs the prefork pool: the threads pool can't grow or shrink.
"""
import json
import logging
import os
import threading
import time

import redis
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.conf import settings

from capacity.config import get_config
from workers import lanes

logger = logging.getLogger('heavy_lanes')
HEARTBEAT_FACTOR = 3  # a node is live while it renewed its heartbeat within 3 reconcile intervals


# Held while the reconciler works, and taken by every fork of this process (pool_grow forks a new pool
# process): a child forked while this thread was inside the database or Redis client could inherit one of
# their locks held, and hang on its first call. Forks wait for the reconciler to be idle instead.
_fork_guard = threading.Lock()


def _after_fork_in_child():
    global _fork_guard
    _fork_guard = threading.Lock()


os.register_at_fork(before=lambda: _fork_guard.acquire(), after_in_parent=lambda: _fork_guard.release(),
                    after_in_child=_after_fork_in_child)


def nodes_key(queue):
    return f'{settings.CAPACITY_KEY_PREFIX}:nodes:{queue}'


def pool_key(queue):
    return f'{settings.CAPACITY_KEY_PREFIX}:pool:{queue}'


def share_of(total, nodes, me):
    """This node's part of `total` pool slots split over `nodes` (which include `me`)."""
    ordered = sorted(nodes)
    if me not in ordered:
        return 0
    base, extra = divmod(total, len(ordered))
    return base + (1 if ordered.index(me) < extra else 0)


def live_nodes(client, queue, me, ttl_seconds):
    """Refresh `me`'s heartbeat for `queue` and return the nodes whose heartbeat hasn't expired."""
    now = time.time()
    key = nodes_key(queue)
    pipe = client.pipeline()
    pipe.zremrangebyscore(key, '-inf', now)
    pipe.zadd(key, {me: now + ttl_seconds})
    pipe.expire(key, int(ttl_seconds * 2) + 1)
    pipe.zrange(key, 0, -1)
    return [node.decode() if isinstance(node, bytes) else node for node in pipe.execute()[-1]]


def read_pools(client, queue):
    """{node: {share, processes, consuming, configured, updated}} as the lane's nodes last published."""
    raw = client.hgetall(pool_key(queue))
    now = time.time()
    pools = {}
    live = {n.decode() if isinstance(n, bytes) else n for n in client.zrangebyscore(nodes_key(queue), now, '+inf')}
    for node, value in raw.items():
        node = node.decode() if isinstance(node, bytes) else node
        if node in live:
            pools[node] = json.loads(value)
    return pools


class PoolReconciler(threading.Thread):
    def __init__(self, app, consumer, hostname, queues, interval=None, client=None):
        super().__init__(name='heavy-lanes-pool', daemon=True)
        self.app = app
        self.consumer = consumer
        self.hostname = hostname
        self.queues = [queue for queue in queues if queue in lanes.BY_NAME]
        self.interval = interval or settings.WORKERS_RECONCILE_SECONDS
        self.client = client or redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
        self.applied = {}  # queue -> the share last applied
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            try:
                with _fork_guard:
                    self.reconcile()
            except Exception:  # noqa: BLE001 - keep reconciling; the next tick may work
                logger.exception('Pool reconcile failed on %s', self.hostname)
            self.stopped.wait(self.interval)

    def stop(self):
        self.stopped.set()
        for queue in self.queues:
            try:
                self.client.zrem(nodes_key(queue), self.hostname)
                self.client.hdel(pool_key(queue), self.hostname)
            except redis.RedisError:
                pass

    def processes(self):
        try:
            return self.consumer.pool.num_processes
        except AttributeError:  # the pool is gone: the worker is shutting down
            return 0

    def consuming(self, queue):
        task_consumer = getattr(self.consumer, 'task_consumer', None)
        return bool(task_consumer and task_consumer.consuming_from(queue))

    def reconcile(self):
        config = get_config()
        for queue in self.queues:
            nodes = live_nodes(self.client, queue, self.hostname, self.interval * HEARTBEAT_FACTOR)
            share = share_of(lanes.get_queue(queue).pool_size(config), nodes, self.hostname)
            if self.applied.get(queue) != share:
                self.apply(queue, share)
                self.applied[queue] = share
            self.publish(queue, share, config)

    def apply(self, queue, share):
        # Fire and forget (reply=False): the main process runs these commands and forks new pool processes
        # for pool_grow; waiting for the reply here would keep this thread inside kombu, holding its locks,
        # at the moment of the fork, and a child that inherits a held lock hangs on its first call.
        control = self.app.control
        destination = [self.hostname]
        if share == 0:
            if self.consuming(queue):
                control.cancel_consumer(queue, destination=destination, reply=False)
            logger.info('Lane %s paused on %s (share 0)', queue, self.hostname)
            return
        if not self.consuming(queue):
            control.add_consumer(queue, destination=destination, reply=False)
        current = self.processes()
        if share > current:
            control.pool_grow(share - current, destination=destination, reply=False)
        elif share < current:
            control.pool_shrink(current - share, destination=destination, reply=False)
        logger.info('Lane %s on %s sized %s -> %s', queue, self.hostname, current, share)

    def publish(self, queue, share, config):
        self.client.hset(pool_key(queue), self.hostname, json.dumps({
            'share': share,
            'configured': lanes.get_queue(queue).pool_size(config),
            'processes': self.processes(),
            'consuming': self.consuming(queue),
            'updated': time.time(),
        }))
        self.client.expire(pool_key(queue), int(self.interval * HEARTBEAT_FACTOR * 2) + 1)


_reconciler = None
_served = []  # the lane queues this node was started for (-Q), whether it consumes them now or not


@celeryd_after_setup.connect
def skip_paused_lanes(sender=None, instance=None, **kwargs):
    """Don't start consuming a lane whose pool size is 0: a call it took would run in a paused lane."""
    queues = instance.app.amqp.queues
    _served[:] = [name for name in (queues.consume_from or {}) if name in lanes.BY_NAME]
    try:
        config = get_config()
    except Exception:  # noqa: BLE001 - the reconciler sizes the pool once it can read the config
        return
    for name in _served:
        if lanes.get_queue(name).pool_size(config) == 0:
            queues.deselect(name)
            logger.info('Lane %s is paused: %s starts without consuming it', name, sender)


@worker_ready.connect
def start_reconciler(sender=None, **kwargs):
    """Start sizing this node's lane pools once the worker consumes (prefork workers only)."""
    global _reconciler
    consumer = sender
    queues = list(_served) or list(consumer.app.amqp.queues.consume_from or {})
    if not any(queue in lanes.BY_NAME for queue in queues):
        return
    if type(consumer.pool).__module__ != 'celery.concurrency.prefork':
        logger.warning('Lane pools are sized only on the prefork pool; %s is left as started', consumer.hostname)
        return
    _reconciler = PoolReconciler(consumer.app, consumer, consumer.hostname, queues)
    _reconciler.start()


@worker_shutdown.connect
def stop_reconciler(**kwargs):
    if _reconciler is not None:
        _reconciler.stop()
