"""The limiter's policy as pure functions of config, counts and the call: no Redis, no Django models.

Which lanes a call takes and their limits, which lanes are full, the decision, Retry-After, the scope a
refusal names, the concurrency a client should use, and the 429 body. capacity.gate feeds these with what
the lane store returned.
"""
import math
from dataclasses import dataclass

from capacity.constants import ENFORCE, ERROR_CODE, MATCH, Decision, Lane

# Lanes where slots are reserved for single-row calls: bulk calls may fill them only to limit - reserve.
RESERVED_LANES = (Lane.API_HEAVY, Lane.API_HEAVY_TASK, Lane.ES2_KNN)


@dataclass(frozen=True)
class Call:
    """What the limiter needs to know about one heavy call (or one request that only waits)."""

    endpoint: str
    rows: int
    tier: str
    user_id: object
    semantic: bool = False
    reranker: bool = False
    waits: bool = False  # its request waits for the result (it takes a waiting slot of its own: wait_slot)
    host: str = ''       # the API host, for the api_heavy_task lane
    queue: str = ''      # the Celery queue it will run on ('' when it runs nowhere, e.g. tests)
    draws_on: Lane | None = None  # the lane whose limit sizes that queue's pool (its waiting room's lane)
    wait_slot: bool = False  # only waits for another call (a long poll): this host's lane and nothing else

    @property
    def single_row(self):
        return is_single_row(self.endpoint, self.rows)


@dataclass(frozen=True)
class LaneLimit:
    """One lane a call takes: the lane, the parts of its key after the lane name, and its limit here."""

    lane: Lane
    parts: tuple = ()
    limit: int = 0


def is_single_row(endpoint, rows):
    """A person waiting on one row. $rerank is never single-row: it comes from bulk auto-match runs."""
    return endpoint == MATCH and rows == 1


def lane_limit(config, lane):
    """A shared lane's configured limit (before the single-row reserve)."""
    if lane == Lane.API_HEAVY:
        return config.api_heavy.cluster
    if lane == Lane.API_HEAVY_TASK:
        return config.api_heavy.per_task
    if lane == Lane.ES2_KNN:
        return config.es2_knn
    raise ValueError(f'{lane} has no single configured limit')


def bulk_limit(limit, config):
    """What bulk calls may fill of a lane that keeps `reserve_single_row` slots for single-row calls."""
    return max(limit - config.reserve_single_row, 0)


def call_limit(config, lane, call):
    """This call's limit in a reserved lane: the whole lane for a single-row call, else the bulk share."""
    limit = lane_limit(config, lane)
    return limit if call.single_row else bulk_limit(limit, config)


def lanes_for(config, call, enforced=False):
    """The lanes `call` takes, in order, with this call's limit in each."""
    if call.wait_slot:
        # A host full of bulk calls' waiting requests still holds a single-row call's (the reserve).
        return [LaneLimit(Lane.API_HEAVY_TASK, (call.host,), call_limit(config, Lane.API_HEAVY_TASK, call))]
    lanes = [LaneLimit(Lane.API_HEAVY, (), call_limit(config, Lane.API_HEAVY, call))]
    if call.semantic:
        lanes.append(LaneLimit(Lane.ES2_KNN, (), call_limit(config, Lane.ES2_KNN, call)))
    lanes.append(LaneLimit(Lane.TIER, (call.tier,), config.tiers[call.tier]))
    lanes.append(LaneLimit(Lane.USER, (call.user_id,), config.per_user[call.tier]))
    if enforced:
        lanes = with_waiting_room(config, call, lanes)
    return lanes


def with_waiting_room(config, call, lanes):
    """Let up to queue.max_waiting[queue] calls beyond the limit wait in the queue (never a paused lane)."""
    room = config.queue.max_waiting.get(call.queue, 0)
    if not room or call.draws_on is None:
        return lanes
    return [LaneLimit(item.lane, item.parts, item.limit + room)
            if item.lane == call.draws_on and item.limit > 0 else item for item in lanes]


def full_lanes(lanes, before):
    """The lanes whose count before this call had reached their limit."""
    return tuple([item.lane for item, count in zip(lanes, before) if count >= item.limit])


def decide(lanes, before, taken):
    """(decision, full lanes) for a call whose lanes held `before` leases and which took a lease or not."""
    full = full_lanes(lanes, before)
    if not full:
        return Decision.ADMITTED, full
    return (Decision.SHADOW_REFUSED if taken else Decision.REFUSED), full


def holds_measured(decision):
    """Whether the release of a call with `decision` feeds the lanes' measured holds (what retry_after
    reads). Only an admitted call held its slots within every lane's limit: a refused caller waits for such
    a call to end. A call shadow mode let past a full lane waits behind the others over the limit, so its
    hold is mostly that wait (after a shadow burst, 32 s for a 375 ms run); an unavailable one was never
    counted, or not known to be within the limit."""
    return decision == Decision.ADMITTED


def limits_of(lanes):
    return {item.lane: item.limit for item in lanes}


def retry_after(config, lanes, before, full, holds=()):
    """Whole seconds a refused call should wait before it could be admitted; `paused` when a limit is 0.

    A full lane with `ahead = count - limit + 1` calls ahead of this one frees a slot each time one of its
    `count` leases is released. `holds[i]` is lane i's measured mean hold (ms, None when nothing was
    measured yet); with it, the lane releases `count / hold` leases per ms (Little's law), so `ahead`
    releases take `ahead * hold / count` ms. A lane with no measurement falls back to the seed's formula,
    `base` seconds per call ahead; so does every lane when `measured` is 0. The wait is the longest over the
    full lanes (all must free up), rounded up to whole seconds and kept between `min` and `max`.
    """
    bounds = config.retry_after
    limits = limits_of(lanes)
    if any(limits[lane] == 0 for lane in full):
        return bounds.paused
    holds = tuple(holds) if bounds.measured else ()
    holds += (None,) * (len(lanes) - len(holds))
    waits = []
    for item, count, hold in zip(lanes, before, holds):
        if item.lane not in full:
            continue
        ahead = count - item.limit + 1
        if hold is None:
            waits.append(bounds.base * ahead)
        else:
            waits.append(ahead * hold / max(count, 1) / 1000)
    seconds = math.ceil(max(waits) - 1e-9)  # 2.0000000001 s of float noise is still 2 s
    return max(bounds.min, min(bounds.max, seconds))



def scope(limits, full):
    """The lane a refusal names: a paused lane first (it decides the long wait), else the first full one."""
    for lane in full:
        if limits[lane] == 0:
            return lane
    return full[0] if full else None


def suggested_concurrency(limits, counts):
    """How many calls at once this user should keep in flight, given what the lanes have left.

    None without lanes; 0 when a lane is paused; the per-user limit when nothing could be counted;
    otherwise the user's own calls plus the smallest headroom left in a shared lane, between 1 and the
    per-user limit. api_heavy_task is left out: it is per API host, and the balancer spreads calls.
    """
    if not limits or Lane.USER not in limits:
        return None
    if 0 in limits.values():
        return 0
    user_limit = limits[Lane.USER]
    if not counts:
        return user_limit
    headroom = min([limits[lane] - counts[lane] for lane in limits if lane != Lane.API_HEAVY_TASK])
    return max(1, min(user_limit, counts[Lane.USER] + headroom))


def refusal_body(retry_seconds, scope_lane, paused):
    """The 429 body of a capacity refusal."""
    return {
        'detail': f'Matching is busy. Please retry in {retry_seconds} seconds.',
        'error_code': ERROR_CODE,
        'scope': str(scope_lane) if scope_lane is not None else None,
        'paused': bool(paused),
        'retry_after': retry_seconds,
    }


def is_enforced(config, aware):
    """Enforce mode refuses every client with enforce_for=all, else only those that say they handle it."""
    if config.mode != ENFORCE:
        return False
    return config.enforce_for == 'all' or bool(aware)
