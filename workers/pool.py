"""Size each lane worker's pool from the capacity config, across every node that serves the lane.

A lane's pool size (workers.lanes) is split over the live nodes consuming its queue so that the total
equals it: nodes sorted by name, the first `size % n` get one more. Each node runs a PoolReconciler thread
in its main process (started when the worker is ready) that, every WORKERS_RECONCILE_SECONDS:
1. refreshes its heartbeat in the lane's node set (a sorted set scored by expiry, like the leases);
2. computes its share from the config and the live nodes;
3. when the share changed since it last applied one, resizes through Celery's own control commands
   (pool_grow, which forks the new processes at once: `grow_now`; pool_shrink, after the exited
   processes are taken out: `shrink_now`; add_consumer / cancel_consumer) addressed to itself; a share of 0
   (the lane paused, or more nodes than slots) stops consuming the queue, so its calls wait and expire;
4. publishes what it wants and what it has (share, pool processes, consuming) for /capacity/status/.
Its first pass waits for the worker's event loop to have turned once (`mailbox_heard`): kombu's Redis
transport subscribes the node's mailbox in that first turn, after worker_ready, and a command sent to itself
before then reached nobody.

A hand resize (Flower's pool grow/shrink, `celery control pool_grow`) becomes the lane's limit
(workers.hand_resize): the reconciler remembers what it asked for (`Sizing`) and, once that landed, takes
the pool's size as settled; a later change it didn't ask for is a hand resize, turned into one config
change (source `flower`), after which every node re-splits the new total, this one included. Its own
resizes are never taken for hand ones: while one is pending nothing is read as a hand resize, and one that
doesn't land within PENDING_TICKS intervals is settled as it is. Only a node that serves one lane queue
does this (the pool of a node serving several is shared by them, so a resize names no lane). Resizing
needs the prefork pool: the threads pool can't grow or shrink. The worker's signal handlers that start and
stop the reconciler are in workers.signals.
"""
import json
import logging
import threading

import redis
from celery.worker import control as worker_control
from django.conf import settings

from capacity.config import clear_cache, get_config
from capacity.keys import nodes_key, pool_key
from common import connections
from common.process import ForkGuard
from workers import broker, hand_resize, lanes

logger = logging.getLogger('heavy_lanes')
HEARTBEAT_FACTOR = 3  # a node is live while it renewed its heartbeat within 3 reconcile intervals
PENDING_TICKS = 5     # an own resize that hasn't landed after this many intervals is settled as it is
MAILBOX_WAIT_SECONDS = 10.0    # the longest the first pass waits for the event loop to turn (mailbox_heard)
MAILBOX_SETTLE_SECONDS = 0.2   # then this, so Redis has read the mailbox's subscribe before the first command


GROW_COMMAND = 'heavy_lanes_pool_grow'


@worker_control.control_command(name=GROW_COMMAND, args=[('n', int)], signature='[N=1]')
def grow_now(state, n=1, **kwargs):
    """Celery's `pool_grow`, then the new processes forked at once. billiard's grow only raises the pool's
    size; its processes are forked by the pool's maintenance, which runs every 5 s (or when a process
    exits), so for up to 5 s a lane grown to two ran one call at a time while the reconciler already
    reported two processes. Runs in the worker's main thread, where that maintenance forks too."""
    reply = worker_control.pool_grow(state, n, **kwargs)
    pool = getattr(state.consumer.pool, '_pool', None)
    if 'ok' in reply and hasattr(pool, 'maintain_pool'):
        pool.maintain_pool()
    return reply


SHRINK_COMMAND = 'heavy_lanes_pool_shrink'


@worker_control.control_command(name=SHRINK_COMMAND, args=[('n', int)], signature='[N=1]')
def shrink_now(state, n=1, **kwargs):
    """Celery's `pool_shrink`, after the pool's maintenance has taken out the processes that exited.

    billiard shrinks by stopping idle processes from its list of processes, and takes one that exited
    out of that list only at its next maintenance (every 5 s). A shrink that found every process busy
    stops what idle ones there are and fails; the reconciler asks again later (`Sizing.retry`), and if
    that came before the maintenance, the process the first shrink stopped, exited but still listed and
    idle, was "stopped" a second time: the pool's count fell below the processes still running, which
    then all stayed (billiard never stops one over its count) and ran more calls than the lane's pool."""
    pool = getattr(state.consumer.pool, '_pool', None)
    if hasattr(pool, 'maintain_pool'):
        pool.maintain_pool()
    return worker_control.pool_shrink(state, n, **kwargs)


class Sizing:
    """What this node's reconciler knows of its pool's size for one queue."""

    def __init__(self):
        self.settled = None  # the pool size last settled: what an own resize left, or a hand one adopted
        self.expected = None  # the size an own resize asked for, while it hasn't landed
        self.ticks = 0       # intervals the own resize has been pending
        self.missed = None   # the size an own resize asked for and never got (a shrink with every process busy)

    def asked(self, size):
        self.expected, self.ticks, self.missed = size, 0, None

    def observe(self, processes):
        """Return the hand change (processes - settled) seen now, or 0; settle an own resize that landed."""
        if self.expected is not None:
            self.ticks += 1
            if processes == self.expected or self.ticks >= PENDING_TICKS:
                self.missed = None if processes == self.expected else self.expected
                self.settled, self.expected = processes, None
            return 0
        if self.settled is None:
            self.settled = processes
        if processes != self.settled:
            self.missed = None  # a hand resize: the reconciler adopts it, it doesn't undo it
        return processes - self.settled

    def retry(self, share, processes):
        """Whether to ask for `share` again: an own resize to it was settled without landing, and nothing
        changed the pool since. Celery refuses a shrink while every process is busy, and a pool left bigger
        than its share (after a stall made each node think it was alone) would run more calls at once
        than the lane's pool, for good."""
        return share > 0 and self.missed == share and processes == self.settled


# Held while the reconciler reads the config, and taken by every fork of this process (pool_grow forks a
# new pool process): a child forked while this thread was inside the database client (SQLite's own mutexes)
# could inherit a lock held and hang on its first query. Its Redis clients are per process
# (common.connections), so a child never touches them, and the fork needn't wait for Redis I/O: a Redis
# stall held the guard, and with it every fork, for the socket timeouts.
fork_guard = ForkGuard()


def mailbox_heard(hub, timeout=MAILBOX_WAIT_SECONDS):
    """Wait until the worker's event loop (kombu's Hub) has turned once; True if it did within `timeout` s.

    The reconciler resizes its node with control commands sent to itself, and kombu's Redis transport
    subscribes the node's mailbox (a pub/sub channel) in a tick callback of the loop's first turn, which
    comes after worker_ready starts the reconciler: a command published before that reaches nobody. The
    first grow was lost so (seen starting the benchmark stack: a node ready at .739 s asked for its second
    process at .741 and kept one), and the pool ran at one process until the resize was settled as missed
    and asked again, PENDING_TICKS intervals later. A callback that schedules itself again runs in the
    loop's second turn, after the first turn's tick callbacks."""
    turned = threading.Event()
    hub.call_soon(lambda: hub.call_soon(turned.set))
    return turned.wait(timeout)


def share_of(total, nodes, me):
    """This node's part of `total` pool slots split over `nodes` (which include `me`)."""
    ordered = sorted(nodes)
    if me not in ordered:
        return 0
    base, extra = divmod(total, len(ordered))
    return base + (1 if ordered.index(me) < extra else 0)


def server_time(client):
    """Redis's clock, in seconds: every node's heartbeat and published pool is timed by it, as the leases
    are, so a host whose clock is ahead neither keeps a stopped node alive nor takes live ones for gone
    (a node 30 s ahead once saw every other node expired and took a whole lane's pool beside theirs)."""
    seconds, micros = client.time()
    return seconds + micros / 1e6


def live_nodes(client, queue, me, ttl_seconds):
    """Refresh `me`'s heartbeat for `queue` and return the nodes whose heartbeat hasn't expired."""
    now = server_time(client)
    key = nodes_key(queue)
    pipe = client.pipeline()
    pipe.zremrangebyscore(key, '-inf', now)
    pipe.zadd(key, {me: now + ttl_seconds})
    pipe.expire(key, int(ttl_seconds * 2) + 1)
    pipe.zrange(key, 0, -1)
    return [node.decode() if isinstance(node, bytes) else node for node in pipe.execute()[-1]]


def read_pools(client, queue):
    """{node: {share, processes, consuming, configured, updated, age}} as the lane's live nodes last
    published; `age`: seconds since, by Redis's clock."""
    raw = client.hgetall(pool_key(queue))
    now = server_time(client)
    pools = {}
    live = {n.decode() if isinstance(n, bytes) else n for n in client.zrangebyscore(nodes_key(queue), now, '+inf')}
    for node, value in raw.items():
        node = node.decode() if isinstance(node, bytes) else node
        if node in live:
            pool = json.loads(value)
            pool['age'] = max(now - pool['updated'], 0.0)
            pools[node] = pool
    return pools


class PoolReconciler(threading.Thread):
    def __init__(self, app, consumer, hostname, queues, interval=None, client=None):
        super().__init__(name='heavy-lanes-pool', daemon=True)
        self.app = app
        self.consumer = consumer
        self.hostname = hostname
        self.queues = [queue for queue in queues if queue in lanes.QUEUE_NAMES]
        self.interval = interval or settings.WORKERS_RECONCILE_SECONDS
        self.client = client or connections.connect('pools')
        self.applied = {}  # queue -> the share last applied
        self.sizing = {queue: Sizing() for queue in self.queues}
        self.sized_from = {}  # queue -> the config its share was last computed from
        self.stopped = threading.Event()

    def run(self):
        self.await_mailbox()
        while not self.stopped.is_set():
            try:
                with fork_guard:  # the config may be read from the database: not while the process forks
                    config = get_config()
                self.reconcile(config)  # Redis through this process's own clients: a child makes its own
            except Exception:  # noqa: BLE001 - keep reconciling; the next tick may work
                logger.exception('Pool reconcile failed on %s', self.hostname)
            self.stopped.wait(self.interval)

    def await_mailbox(self):
        """Before the first pass: until this node hears its own control commands (`mailbox_heard`)."""
        hub = getattr(self.consumer, 'hub', None)
        if hub is None:  # no event loop: the mailbox is consumed as the worker starts
            return
        if mailbox_heard(hub):
            self.stopped.wait(MAILBOX_SETTLE_SECONDS)
        else:
            logger.warning('The event loop of %s did not turn within %s s; its pool is sized anyway, and a resize '
                           'it misses is asked again later', self.hostname, MAILBOX_WAIT_SECONDS)

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

    def reconcile(self, config=None):
        config = config or get_config()
        for queue in self.queues:
            nodes = live_nodes(self.client, queue, self.hostname, self.interval * HEARTBEAT_FACTOR)
            if len(self.queues) == 1:
                with fork_guard:  # adopting a hand resize writes the config to the database
                    adopted = self.adopt_hand_resize(queue)
                    if adopted:
                        config = get_config()  # the saved change: re-split the new total, this node included
                if adopted:
                    self.applied.pop(queue, None)
            share = share_of(lanes.get_queue(queue).pool_size(config), nodes, self.hostname)
            self.sized_from[queue] = config
            if self.applied.get(queue) != share or self.sizing[queue].retry(share, self.processes()):
                self.apply(queue, share)
                self.applied[queue] = share
            if len(self.queues) == 1:
                self.hold_to(share)
            self.publish(queue, share, config)

    def hold_to(self, share):
        """Take no call beyond `share` while the pool still has more processes than that.

        billiard stops only idle processes, so a pool lowered while its calls ran keeps its size until they
        end and a later shrink lands (the node kept 4 processes for 50-60 s after a change to 1), and each
        process that finished its call took the next one. The consumer takes a message only while it
        holds fewer requests than its controller's `max_concurrency` (else the pool's processes: Celery's
        worker_disable_prefetch, settings.CELERY_WORKER_DISABLE_PREFETCH): set to the share, a lowered
        width applies at the next reconcile, busy or not. Cleared once the pool is no bigger than its share,
        so a grow, by hand or by the config, is never held back."""
        controller = getattr(self.consumer, 'controller', None)
        if controller is None:
            return
        width = share if 0 < share < self.processes() else None
        if getattr(controller, 'max_concurrency', None) != width:
            controller.max_concurrency = width
            if width is not None:
                logger.info('Lane calls on %s held to %d while the pool shrinks from %d', self.hostname, width,
                            self.processes())

    def adopt_hand_resize(self, queue):
        """Make a hand resize of this node's pool the lane's limit, or drop it for a newer config change that
        resized the queue; True when the pool is to be re-sized from the config now in force."""
        sizing, processes = self.sizing[queue], self.processes()
        change = sizing.observe(processes)
        if not change:
            return False
        if not self.consuming(queue):
            sizing.settled = processes  # a paused lane's pool runs nothing: its size is no limit
            return False
        outcome = hand_resize.adopt(self.client, queue, self.hostname, sizing.settled, processes,
                                    sized_from=self.sized_from.get(queue), lock_seconds=self.interval * 2)
        if outcome == hand_resize.BUSY:
            return False  # another node is saving its own: add this one to it next tick
        sizing.settled = processes
        if outcome == hand_resize.SUPERSEDED:
            clear_cache()  # size the pool from the change that superseded it, not a cached older version
        return outcome in (hand_resize.SAVED, hand_resize.SUPERSEDED)

    def apply(self, queue, share):
        # Fire and forget (reply=False): the main process runs these commands and forks new pool processes
        # for pool_grow; waiting for the reply here would keep this thread inside kombu, holding its locks,
        # at the moment of the fork, and a child that inherits a held lock hangs on its first call.
        control = self.app.control
        destination = [self.hostname]
        current = self.processes()
        # What this resize will leave (a paused lane keeps its processes): until the pool has it, no change
        # of the pool's size is read as a hand resize.
        self.sizing[queue].asked(share if share > 0 else current)
        if share == 0:
            if self.consuming(queue):
                control.cancel_consumer(queue, destination=destination, reply=False)
            logger.info('Lane %s paused on %s (share 0)', queue, self.hostname)
            return
        if not self.consuming(queue):
            control.add_consumer(queue, destination=destination, reply=False)
        if share > current:
            control.broadcast(GROW_COMMAND, arguments={'n': share - current}, destination=destination,
                              reply=False)
        elif share < current:
            control.broadcast(SHRINK_COMMAND, arguments={'n': current - share}, destination=destination,
                              reply=False)
        logger.info('Lane %s on %s sized %s -> %s', queue, self.hostname, current, share)

    def publish(self, queue, share, config):
        acks = broker.ack_status()
        self.client.hset(pool_key(queue), self.hostname, json.dumps({
            'share': share,
            'configured': lanes.get_queue(queue).pool_size(config),
            'processes': self.processes(),
            'consuming': self.consuming(queue),
            'acks_unsettled': acks['unsettled'],
            'acks_failed_total': acks['failed_total'],
            'updated': server_time(self.client),
        }))
        self.client.expire(pool_key(queue), int(self.interval * HEARTBEAT_FACTOR * 2) + 1)
