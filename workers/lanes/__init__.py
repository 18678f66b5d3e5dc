"""Queue-backed lanes: one module each, and the one routing table that maps a heavy call to its lane.

Each lane module names its Celery queue, what it carries, and how its worker pool is sized from the
capacity config (`pool_size(config)`): a lane's pool size is its limit for the calls it carries, so one
limit caps both admission (leases) and execution (pool slots). Routing is pure and strict: a lane name
that isn't in the table raises UnknownLane.

This package imports no Celery, so the API and the capacity app can route without loading workers.
"""
from workers.lanes import api_heavy, es2_knn, interactive

LANES = {lane.QUEUE: lane for lane in (interactive, es2_knn, api_heavy)}


class UnknownLane(LookupError):
    """A lane or queue name that the routing table doesn't have."""

    def __init__(self, name):
        super().__init__(f'Unknown lane "{name}"; the lanes are {", ".join(LANES)}.')
        self.name = name


def get_lane(name):
    try:
        return LANES[name]
    except KeyError:
        raise UnknownLane(name) from None


def route(endpoint, rows, semantic=False):
    """The lane (= queue name) a heavy call runs on."""
    for lane in LANES.values():
        if lane.carries(endpoint, rows, semantic):
            return lane.QUEUE
    raise UnknownLane(f'{endpoint} rows={rows} semantic={semantic}')


def pool_sizes(config):
    """{queue: pool size} for every lane under `config`."""
    return {name: lane.pool_size(config) for name, lane in LANES.items()}
