"""What staff see at /capacity/status/ and `manage.py capacity status`: the lanes as Redis has them now.

`get_status(config)` reads Redis directly (through the lane store's deadline) and never raises: a Redis
error shows as `redis: '<ExcClass>: <message>'`. Other apps add sections of their own with
`add_section(name, read)` (the workers app adds `queues`: depth, oldest waiting, pools), so this module
needs nothing from them.
"""
from capacity.constants import TIERS, Lane
from capacity.decisions import bulk_limit
from capacity.keys import lane_id, lane_key
from capacity.store import Unknown, get_store

_sections = {}  # name -> read(config) -> JSON-able value


def add_section(name, read):
    """Show `read(config)` under `name` in every status (an app's ready() registers it)."""
    _sections[name] = read


def get_status(config):
    status = {'mode': config.mode, 'enforce_for': config.enforce_for}
    status.update(get_lanes(config))
    for name, read in _sections.items():
        status[name] = read(config)
    return status


def get_lanes(config):
    store = get_store()
    task_keys = store.find_keys(Lane.API_HEAVY_TASK)
    user_keys = store.find_keys(Lane.USER)
    tier_keys = [lane_key(Lane.TIER, tier) for tier in TIERS]
    keys = [lane_key(Lane.API_HEAVY), lane_key(Lane.ES2_KNN), *tier_keys, *(task_keys or ()), *(user_keys or ())]
    counted = store.count(keys) if task_keys is not None and user_keys is not None else None
    expired = store.expired_total()
    failed = next((answer for answer in (task_keys, user_keys, counted, expired) if isinstance(answer, Unknown)),
                  None)
    if failed is not None:  # status reports a broken Redis instead of failing
        return {'redis': failed.error}
    counts = dict(zip(keys, counted))
    return {
        'redis': 'ok',
        'api_heavy': {'in_flight': counts[keys[0]], 'limit': config.api_heavy.cluster,
                      'bulk_limit': bulk_limit(config.api_heavy.cluster, config)},
        'es2_knn': {'in_flight': counts[keys[1]], 'limit': config.es2_knn,
                    'bulk_limit': bulk_limit(config.es2_knn, config)},
        'tasks': {lane_id(key): {'in_flight': counts[key], 'limit': config.api_heavy.per_task}
                  for key in task_keys if counts[key]},
        'tiers': {tier: {'in_flight': counts[key], 'limit': config.tiers[tier]}
                  for tier, key in zip(TIERS, tier_keys)},
        'users': {lane_id(key): {'in_flight': counts[key]} for key in user_keys if counts[key]},
        'leases_expired_total': expired,
    }
