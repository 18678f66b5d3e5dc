"""Queue status for /capacity/status/ and /metrics: depth, oldest waiting call, and the lane's pools; and
`get_indexes`, the match indexes the lanes' calls need (concepts.services.index_status).

Depth is read on the broker (LLEN of the queue's list and of each priority level's list, as the Redis
transport stores them, workers.messages), so it counts messages no worker has taken yet; the message of a
call cancelled or expired while queued is taken out when it ends (and by the sweep, should that fail),
so depth counts only calls that still wait. The oldest waiting age comes from the rows of the calls
still queued and not past their deadline. Pools are what each live lane node last published
(workers.pool). No Celery import here.
"""

import redis
from django.conf import settings
from django.db.models import Min
from django.utils import timezone

from common import connections
from workers import lanes, messages
from workers.models import State, Work
from workers.pool import read_pools


def depth(queue):
    return messages.depth(queue, connections.connect('status', settings.CELERY_BROKER_URL))


def oldest_waiting(now=None):
    """{queue: seconds the oldest work that still waits has waited} (queued, its deadline not passed)."""
    now = now or timezone.now()
    rows = Work.objects.filter(state=State.QUEUED, expires_at__gt=now).values('queue').annotate(
        oldest=Min('created_at'))
    return {row['queue']: round((now - row['oldest']).total_seconds(), 3) for row in rows}


def get_indexes(config):
    """Each source's match indexes: ready, or how far their build is (a semantic call waits in its queue
    until its index is ready). Never raises: a failure to read them shows as {"error": ...}."""
    try:
        # Imported when asked: the matching service is an API process's to load when it warms up (api.wsgi),
        # not every Django process's at setup.
        from concepts.services import index_status
        return index_status()
    except Exception as ex:  # noqa: BLE001 - status reports what it can't read instead of failing
        return {'error': f'{type(ex).__name__}: {ex}'[:300]}


def get_queues(config):
    ages = oldest_waiting()
    queues = {}
    for queue in lanes.QUEUES:
        name = queue.name
        entry = {'carries': queue.carries, 'sized_by': queue.sized_by,
                 'configured_pool': queue.pool_size(config), 'oldest_waiting_seconds': ages.get(name, 0.0)}
        try:
            entry['depth'] = depth(name)
        except redis.RedisError as ex:
            entry['depth'], entry['broker'] = None, f'{type(ex).__name__}: {ex}'[:300]
        try:
            pools = read_pools(connections.connect('status'), name)
        except redis.RedisError as ex:
            pools, entry['workers_error'] = {}, f'{type(ex).__name__}: {ex}'[:300]
        entry['workers'] = {node: {'processes': pool['processes'], 'share': pool['share'],
                                   'consuming': pool['consuming'],
                                   'drift': pool['processes'] - pool['share'] if pool['consuming'] else 0,
                                   'acks_unsettled': pool.get('acks_unsettled', 0),
                                   'acks_failed_total': pool.get('acks_failed_total', 0),
                                   'seen_seconds_ago': round(pool['age'], 1)}
                            for node, pool in sorted(pools.items())}
        consuming = [pool for pool in pools.values() if pool['consuming']]
        entry['consumers'] = len(consuming)
        entry['pool'] = sum(pool['processes'] for pool in consuming)
        entry['drift'] = entry['pool'] - entry['configured_pool'] if pools else None
        queues[name] = entry
    return queues
