"""The queues: the one table of queue-backed lanes, and the routing rule that picks a call's queue.

Vocabulary (docs/architecture.md): a *lane* is a lease lane of the limiter (capacity.constants.Lane); a
*queue* is the Celery queue a call runs on. Each queue draws on one lane: the queue's worker pool is that
lane's limit for the calls the queue carries, so one number caps both admission (leases) and execution
(pool slots). Everything that needs queue facts — Celery's `task_queues`, status, metrics, the launcher,
the benchmarks and the tests — reads `QUEUES`.

Pure data and pure functions: no Django, no Celery, so the launcher and the API can use it without loading
the workers. Routing is strict: a name that isn't in the table raises UnknownQueue.
"""
from dataclasses import dataclass

from capacity.constants import MATCH, RERANK, Lane
from capacity.decisions import bulk_limit, is_single_row, lane_limit


@dataclass(frozen=True)
class WorkQueue:
    """One queue-backed lane: the queue, the lease lane it draws on, and which calls it carries."""

    name: str
    draws_on: Lane
    carries: str
    endpoints: tuple[str, ...]
    single_row: bool              # carries single-row $match calls (else bulk calls)
    semantic: bool | None = None  # None: semantic or not

    def takes(self, endpoint, rows, semantic):
        return (endpoint in self.endpoints and is_single_row(endpoint, rows) == self.single_row
                and (self.semantic is None or self.semantic == bool(semantic)))

    @property
    def sized_by(self):
        """The config expression its pool size is, for status and docs."""
        if self.single_row:
            return 'reserve_single_row'
        return f'{LANE_CONFIG_PATHS[self.draws_on]} - reserve_single_row'

    def pool_size(self, config):
        """Pool processes this queue may run at once: the single-row reserve, or its lane's bulk share."""
        if self.single_row:
            return config.reserve_single_row
        return bulk_limit(lane_limit(config, self.draws_on), config)

    def sized_to(self, pool_size, config):
        """The config change (nested, for capacity.config.save_config) that makes this queue's pool size
        `pool_size` under `config`: the inverse of `pool_size` (`sized_by`). For `interactive` that is the
        single-row reserve, which every bulk share is counted after."""
        pool_size = max(int(pool_size), 0)
        if self.single_row:
            return {'reserve_single_row': pool_size}
        path = LANE_CONFIG_PATHS[self.draws_on].split('.')
        change = pool_size + config.reserve_single_row
        for key in reversed(path):
            change = {key: change}
        return change


LANE_CONFIG_PATHS = {Lane.API_HEAVY: 'api_heavy.cluster', Lane.ES2_KNN: 'es2_knn'}

QUEUES = (
    WorkQueue('interactive', Lane.API_HEAVY,
              'Single-row `$match` calls (semantic or reranked): a person waiting on one row.',
              endpoints=(MATCH,), single_row=True),
    WorkQueue('es2_knn', Lane.ES2_KNN,
              'Bulk semantic `$match` calls, which run k-nearest-neighbour search on the search backend.',
              endpoints=(MATCH,), single_row=False, semantic=True),
    WorkQueue('api_heavy', Lane.API_HEAVY, 'Bulk reranked lexical `$match` calls and every `$rerank` call.',
              endpoints=(MATCH, RERANK), single_row=False, semantic=False),
)
BY_NAME = {queue.name: queue for queue in QUEUES}
QUEUE_NAMES = tuple(BY_NAME)
# Not a lane and not in QUEUES: the queue of the periodic maintenance tasks Celery beat sends (the sweep,
# retention), consumed by a small worker of its own, never by a lane worker (whose pool is a lane's limit).
MAINTENANCE_QUEUE = 'maintenance'


class UnknownQueue(LookupError):
    """A queue name that the table doesn't have, or a call no queue carries."""

    def __init__(self, name):
        super().__init__(f'Unknown queue "{name}"; the queues are {", ".join(QUEUE_NAMES)}.')
        self.name = name


def get_queue(name):
    try:
        return BY_NAME[name]
    except KeyError:
        raise UnknownQueue(name) from None


def route(endpoint, rows, semantic=False):
    """The queue a heavy call runs on."""
    for queue in QUEUES:
        if queue.takes(endpoint, rows, semantic):
            return queue
    raise UnknownQueue(f'{endpoint} rows={rows} semantic={semantic}')


def pool_sizes(config):
    """{queue name: pool size} for every queue under `config`."""
    return {queue.name: queue.pool_size(config) for queue in QUEUES}


