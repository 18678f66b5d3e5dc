"""The queue table (workers.lanes): routing, pool sizes and the pool split across nodes, as tables. No
database, no Redis."""
import pytest

from capacity.constants import QUEUES, Lane
from capacity.defaults import DEFAULTS
from tests.unit.defaults import config
from workers.lanes import QUEUE_NAMES, UnknownQueue, get_queue, pool_sizes, route
from workers.pool import share_of


@pytest.mark.parametrize('endpoint, rows, semantic, queue', [
    ('$match', 1, True, 'interactive'),    # one row, semantic
    ('$match', 1, False, 'interactive'),   # one row, reranked lexical
    ('$match', 2, True, 'es2_knn'),        # bulk semantic
    ('$match', 50, False, 'api_heavy'),    # bulk reranked lexical
    ('$rerank', 1, False, 'api_heavy'),    # $rerank is never single-row
    ('$rerank', 40, False, 'api_heavy'),
])
def test_routing(endpoint, rows, semantic, queue):
    assert route(endpoint, rows, semantic).name == queue


def test_an_unknown_queue_or_call_raises():
    with pytest.raises(UnknownQueue, match='Unknown queue "nope"'):
        get_queue('nope')
    with pytest.raises(UnknownQueue):
        route('$other', 3, False)


@pytest.mark.parametrize('changes, sizes', [
    ({}, {'interactive': 1, 'es2_knn': 2, 'api_heavy': 3}),
    ({'es2_knn': 1}, {'interactive': 1, 'es2_knn': 0, 'api_heavy': 3}),        # es2_knn paused: all reserve
    ({'reserve_single_row': 0}, {'interactive': 0, 'es2_knn': 3, 'api_heavy': 4}),
    ({'api_heavy': {'cluster': 0}, 'reserve_single_row': 0}, {'interactive': 0, 'es2_knn': 3, 'api_heavy': 0}),
    ({'es2_knn': 0}, {'interactive': 1, 'es2_knn': 0, 'api_heavy': 3}),        # never below 0
])
def test_pool_sizes(changes, sizes):
    assert pool_sizes(config(**changes)) == sizes


@pytest.mark.parametrize('name, draws_on, sized_by', [
    ('interactive', Lane.API_HEAVY, 'reserve_single_row'),
    ('es2_knn', Lane.ES2_KNN, 'es2_knn - reserve_single_row'),
    ('api_heavy', Lane.API_HEAVY, 'api_heavy.cluster - reserve_single_row'),
])
def test_each_queue_draws_on_a_lane(name, draws_on, sized_by):
    queue = get_queue(name)
    assert (queue.draws_on, queue.sized_by) == (draws_on, sized_by)


def test_the_config_has_a_waiting_room_for_every_queue():
    assert tuple(QUEUES) == QUEUE_NAMES == tuple(DEFAULTS['queue']['max_waiting'])


@pytest.mark.parametrize('total, nodes, shares', [
    (3, ['a'], [3]),
    (3, ['b', 'a'], [2, 1]),          # sorted by name: the first `total % n` get one more
    (4, ['a', 'b'], [2, 2]),
    (1, ['a', 'b', 'c'], [1, 0, 0]),  # more nodes than slots: the rest stop consuming
    (0, ['a', 'b'], [0, 0]),          # paused
])
def test_the_pool_is_split_across_nodes_and_sums_to_the_total(total, nodes, shares):
    assert [share_of(total, nodes, node) for node in sorted(nodes)] == shares
    assert sum(share_of(total, nodes, node) for node in nodes) == total


def test_a_node_not_among_the_live_ones_gets_nothing():
    assert share_of(3, ['a', 'b'], 'c') == 0


@pytest.mark.parametrize('queue, pool_size, change', [
    ('interactive', 2, {'reserve_single_row': 2}),     # the single-row reserve is the pool
    ('es2_knn', 3, {'es2_knn': 4}),                    # the bulk share is the limit less the reserve
    ('api_heavy', 4, {'api_heavy': {'cluster': 5}}),   # only the cluster limit; per_task stays
    ('es2_knn', 0, {'es2_knn': 1}),                    # a pool of 0 pauses the lane
])
def test_a_pool_size_turns_back_into_the_config_value_that_sizes_the_queue(queue, pool_size, change):
    from capacity.config import get_defaults, merge
    from capacity.defaults import Config
    defaults = get_defaults()
    assert get_queue(queue).sized_to(pool_size, Config.from_json(defaults)) == change
    assert get_queue(queue).pool_size(Config.from_json(merge(defaults, change))) == pool_size
