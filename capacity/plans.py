"""The lanes a kind of call takes under one config, with their keys and limits: worked out once, then reused.

    plan = plan_for(config, call, enforced)   # plan.lanes, plan.keys, plan.limits, plan.lane_limits

Every admission needs its lanes (capacity.decisions.lanes_for), their Redis keys (capacity.keys) and their
limits; they depend only on the config, the key prefix and a few facts of the call (`shape`), never on the
counts. Working them out on every call was the largest part of the gate's own Python time (docs/benchmarks.md,
"Acquire against one raw EVALSHA"), so they are remembered here.

Remembered per Config object, by identity: `capacity.config.get_config()` hands out one frozen Config until
its cache expires or a change is saved (`save_config` clears the cache), and any other config is a
different object. So a plan never outlives the config it was made under: a lane staff resize applies to
the first call that reads the new config, in every process, exactly as it did without the plans.
"""
from dataclasses import dataclass

from django.conf import settings

from capacity import decisions
from capacity.keys import lane_key

MAX_PLANS = 10_000  # per config; a key per user (the user lane) makes one per user who calls


@dataclass(frozen=True)
class Plan:
    """The lanes of one kind of call, in order, with each one's key and this call's limit there;
    `lane_limits` is {lane: limit} (decisions.limits_of), shared: never changed."""

    lanes: tuple[decisions.LaneLimit, ...]
    keys: tuple[str, ...]
    limits: tuple[int, ...]
    lane_limits: dict


def make_plan(config, call, enforced):
    lanes = tuple(decisions.lanes_for(config, call, enforced=enforced))
    keys = tuple(lane_key(item.lane, *item.parts) for item in lanes)
    return Plan(lanes=lanes, keys=keys, limits=tuple(item.limit for item in lanes),
                lane_limits=decisions.limits_of(lanes))


def shape(call, enforced):
    """What decisions.lanes_for and capacity.keys read: two calls of one shape take the same plan."""
    return (settings.CAPACITY_KEY_PREFIX, call.tier, call.user_id, call.semantic, call.single_row, enforced,
            call.queue, call.draws_on, call.wait_slot, call.host)


# (the Config the plans were made under, {shape: Plan}), replaced as a whole: a thread that read the old
# pair fills the old dict, never the new one.
_plans = (None, {})


def plan_for(config, call, enforced=False):
    """The Plan of `call` under `config` (remembered; see the module docstring). Raises what lanes_for and
    lane_key raise."""
    global _plans
    made_under, plans = _plans
    if made_under is not config:
        plans = {}
        _plans = (config, plans)
    key = shape(call, enforced)
    plan = plans.get(key)
    if plan is None:
        plan = make_plan(config, call, enforced)
        if len(plans) >= MAX_PLANS:
            plans.clear()  # bound the memory; the next calls refill it
        plans[key] = plan
    return plan


def forget():
    """Forget every plan (tests)."""
    global _plans
    _plans = (None, {})
