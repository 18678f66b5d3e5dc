"""The plans the gate reuses (capacity.plans): always what lanes_for and lane_key would give for the config
in hand, whatever changed since the last call: the config (a resize, a reload), the key prefix, the call."""
import pytest

from capacity import plans
from capacity.constants import Lane
from capacity.decisions import Call, lanes_for
from capacity.keys import lane_key
from tests.unit.defaults import config

A, K, R, U = Lane.API_HEAVY, Lane.ES2_KNN, Lane.TIER, Lane.USER


@pytest.fixture(autouse=True)
def fresh_plans(settings):
    settings.CAPACITY_KEY_PREFIX = 'plans'
    plans.forget()
    yield
    plans.forget()


def call(rows=10, tier='core', user_id=7, **fields):
    return Call(endpoint='$match', rows=rows, tier=tier, user_id=user_id, host='h1', semantic=True, **fields)


def worked_out(conf, the_call, enforced=False):
    """What the gate built on every call before there were plans."""
    lanes = lanes_for(conf, the_call, enforced=enforced)
    keys = [lane_key(item.lane, *item.parts) for item in lanes]
    return [(item.lane, item.parts, item.limit) for item in lanes], keys, [item.limit for item in lanes]


def planned(conf, the_call, enforced=False):
    plan = plans.plan_for(conf, the_call, enforced)
    return [(item.lane, item.parts, item.limit) for item in plan.lanes], list(plan.keys), list(plan.limits)


def test_a_plan_is_what_lanes_for_and_the_keys_give():
    conf = config()
    assert planned(conf, call()) == worked_out(conf, call())
    assert planned(conf, call())[1] == ['{plans}:api_heavy', '{plans}:es2_knn', '{plans}:tier:core',
                                        '{plans}:user:7']
    assert plans.plan_for(conf, call()).lane_limits == {A: 3, K: 2, R: 4, U: 3}


def test_a_resized_lane_applies_to_the_next_call_under_the_new_config():
    before = config()
    assert planned(before, call())[2] == [3, 2, 4, 3]
    # What save_config puts in force (and every process reads once its cache expires) is a new Config.
    after = config(api_heavy={'cluster': 10}, es2_knn=6, tiers={'core': 8}, per_user={'core': 5})
    assert planned(after, call())[2] == [9, 5, 8, 5]
    assert plans.plan_for(after, call()).lane_limits == {A: 9, K: 5, R: 8, U: 5}
    assert planned(after, call()) == worked_out(after, call())


def test_a_config_read_again_with_the_same_values_gives_the_same_lanes():
    assert planned(config(), call()) == planned(config(), call()) == worked_out(config(), call())


def test_a_call_under_an_older_config_still_gets_that_configs_limits():
    # A request that read the config just before a resize acquires with what it read, as before the plans.
    old, new = config(), config(tiers={'core': 1})
    assert planned(new, call())[2] == [3, 2, 1, 3]
    assert planned(old, call())[2] == [3, 2, 4, 3]
    assert planned(new, call())[2] == [3, 2, 1, 3]


def test_a_changed_key_prefix_gives_keys_under_the_new_prefix(settings):
    conf = config()
    planned(conf, call())
    settings.CAPACITY_KEY_PREFIX = 'other'
    assert planned(conf, call())[1][0] == '{other}:api_heavy'


@pytest.mark.parametrize('first, second', [
    (call(user_id=7), call(user_id=8)),                 # each user has a lane of their own
    (call(tier='core'), call(tier='preview')),           # a user whose plan changed takes the new tier's lane
    (call(rows=10), call(rows=1)),                       # a single-row call may use the reserve
    (call(), call(wait_slot=True)),                      # a waiting request takes its host's lane alone
    (call(queue='es2_knn', draws_on=K), call(queue='interactive', draws_on=A)),  # another waiting room
])
def test_calls_of_another_shape_get_their_own_lanes(first, second):
    conf = config(mode='enforce', queue={'max_waiting': {'interactive': 2, 'es2_knn': 1, 'api_heavy': 0}})
    for enforced in (False, True):
        planned(conf, first, enforced)
        assert planned(conf, second, enforced) == worked_out(conf, second, enforced)
        assert planned(conf, first, enforced) == worked_out(conf, first, enforced)


def test_the_waiting_room_counts_only_for_an_enforced_call():
    conf = config(mode='enforce', queue={'max_waiting': {'interactive': 0, 'es2_knn': 4, 'api_heavy': 0}})
    the_call = call(queue='es2_knn', draws_on=K)
    assert planned(conf, the_call, enforced=True)[2] == [3, 6, 4, 3]
    assert planned(conf, the_call, enforced=False)[2] == [3, 2, 4, 3]


def test_past_the_bound_the_plans_are_forgotten_and_made_again(monkeypatch):
    monkeypatch.setattr(plans, 'MAX_PLANS', 3)
    conf = config()
    for user_id in range(10):
        assert planned(conf, call(user_id=user_id)) == worked_out(conf, call(user_id=user_id))
    assert len(plans._plans[1]) <= 3
