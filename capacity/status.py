"""What staff see at /capacity/status/ and `manage.py capacity status`: the lanes as Redis has them now.

`get_status(config)` reads Redis directly (through the lane store's deadline) and never raises: a Redis
error shows as `redis: '<ExcClass>: <message>'`. The queues part (depth, oldest waiting, pools) comes from
the workers app when it is installed (`workers.status.get_queues`), so this module needs no Celery.
"""
from capacity.constants import TIERS, Lane
from capacity.decisions import bulk_limit
from capacity.failopen import describe
from capacity.keys import lane_id, lane_key
from capacity.store import RedisLanes


def get_status(config):
    status = {'mode': config['mode'], 'enforce_for': config['enforce_for']}
    try:
        task_keys = RedisLanes.find_keys(Lane.API_HEAVY_TASK)
        user_keys = RedisLanes.find_keys(Lane.USER)
        tier_keys = [lane_key(Lane.TIER, tier) for tier in TIERS]
        keys = [lane_key(Lane.API_HEAVY), lane_key(Lane.ES2_KNN), *tier_keys, *task_keys, *user_keys]
        counts = dict(zip(keys, RedisLanes.count(keys)))
        expired = RedisLanes.expired_total()
    except Exception as ex:  # noqa: BLE001 - status reports a broken Redis instead of failing
        status['redis'] = describe(ex)
    else:
        status.update({
            'redis': 'ok',
            'api_heavy': {'in_flight': counts[keys[0]], 'limit': config['api_heavy']['cluster'],
                          'bulk_limit': bulk_limit(config['api_heavy']['cluster'], config)},
            'es2_knn': {'in_flight': counts[keys[1]], 'limit': config['es2_knn'],
                        'bulk_limit': bulk_limit(config['es2_knn'], config)},
            'tasks': {lane_id(key): {'in_flight': counts[key], 'limit': config['api_heavy']['per_task']}
                      for key in task_keys if counts[key]},
            'tiers': {tier: {'in_flight': counts[key], 'limit': config['tiers'][tier]}
                      for tier, key in zip(TIERS, tier_keys)},
            'users': {lane_id(key): {'in_flight': counts[key]} for key in user_keys if counts[key]},
            'leases_expired_total': expired,
        })
    try:
        from workers.status import get_queues
    except ImportError:
        return status
    status['queues'] = get_queues(config)
    return status
