"""What admission decided for one call, as a value: decision, lanes with limits and counts, keys, holding.

`capacity.gate.admit()` makes an `Admission`; it never changes after that. It crosses from the API to the
worker on the call's row in one JSON form (`to_json` / `from_json`), and becomes the call's leases again
with `lease()` (the API's) or `worker_lease()` (the worker's: without this API host's lane, which the API
drops when it stops waiting). The response headers, the 429 body and the call's log record are pure
functions of it (`headers`, `quotas`, `refusal_body`, `log_record`).
"""
import dataclasses
from dataclasses import dataclass

from capacity import decisions
from capacity.caller import NO_FACTS, RequestFacts
from capacity.constants import (
    HEADER_DECISION, HEADER_IN_FLIGHT, HEADER_LIMIT, HEADER_SUGGESTED, HEADER_TIER, HEADER_TIER_IN_FLIGHT,
    HEADER_TIER_LIMIT, LOG_EVENT, Decision, Lane,
)
from capacity.lease import Lease
from common.ratelimit import CONCURRENT, Quota

# What a call's message carries of its worker leases (Admission.worker_lease_message, lease_from_message).
LEASE_MESSAGE_KEYS = ('keys', 'token', 'holding', 'acquired_ms', 'within_limit')


@dataclass(frozen=True)
class LaneState:
    """One lane of a call: its Redis key, this call's limit there, and its count (None: not counted)."""

    lane: Lane
    key: str
    limit: int
    count: int | None = None  # leases in the lane, this call's included when it took one


@dataclass(frozen=True)
class Admission:
    decision: Decision | None  # None: the limiter is off (nothing counted, no headers, no log line)
    token: str
    call: decisions.Call | None = None
    mode: str | None = None
    enforced: bool = False
    lanes: tuple[LaneState, ...] = ()
    full: tuple[Lane, ...] = ()
    holding: bool = False       # leases taken (in every lane of `lanes`)
    lease_ms: int = 0
    acquired_ms: int = 0        # Redis's clock (epoch ms) when they were taken: a release measures from it
    retry_after: int | None = None
    suggested: int | None = None
    error: str | None = None    # what the limiter met, `<ExcClass>: <message>`
    facts: RequestFacts = NO_FACTS

    # --- reading it

    @property
    def refused(self):
        return self.decision == Decision.REFUSED

    @property
    def tier(self):
        return self.call.tier if self.call is not None else None

    @property
    def keys(self):
        return [state.key for state in self.lanes]

    @property
    def limits(self):
        return {state.lane: state.limit for state in self.lanes}

    @property
    def counts(self):
        """{lane: count}, empty when nothing was counted (the limiter skipped or failed)."""
        if not self.lanes or any(state.count is None for state in self.lanes):
            return {}
        return {state.lane: state.count for state in self.lanes}

    @property
    def scope(self):
        return decisions.scope(self.limits, self.full)

    @property
    def paused(self):
        scope = self.scope
        return scope is not None and self.limits.get(scope) == 0

    @property
    def within_limit(self):
        """Whether its leases were taken within every lane's limit, so their release measures the holds."""
        return decisions.holds_measured(self.decision)

    @property
    def host_key(self):
        """The key of this API host's lane when the call holds one (it waits in the request), else None."""
        return next((state.key for state in self.lanes if state.lane == Lane.API_HEAVY_TASK), None)

    def with_error(self, error):
        return dataclasses.replace(self, error=self.error or error)

    # --- its leases

    def lease(self, store=None):
        """The leases this admission took, as the API holds them."""
        return Lease(self.keys, self.token, self.lease_ms, holding=self.holding, store=store,
                     acquired_ms=self.acquired_ms, within_limit=self.within_limit)

    def worker_lanes(self):
        """The lanes a worker renews and releases: all but this API host's lane."""
        return [state for state in self.lanes if state.lane != Lane.API_HEAVY_TASK]

    def worker_lease(self, lease_ms, store=None):
        return Lease([state.key for state in self.worker_lanes()], self.token, lease_ms, holding=self.holding,
                     store=store, acquired_ms=self.acquired_ms, within_limit=self.within_limit)

    def worker_lease_message(self):
        """The worker's leases as the call's message carries them (workers.lifecycle.create.send), so a
        worker can renew them before it reads the call's row: `lease_from_message`."""
        return {'keys': [state.key for state in self.worker_lanes()], 'token': self.token,
                'holding': self.holding, 'acquired_ms': self.acquired_ms, 'within_limit': self.within_limit}

    def worker_limits(self):
        return [state.limit for state in self.worker_lanes()]

    # --- its one JSON form

    def to_json(self):
        call = dataclasses.asdict(self.call) if self.call is not None else None
        if call is not None and call['draws_on'] is not None:
            call['draws_on'] = str(call['draws_on'])
        return {
            'decision': str(self.decision) if self.decision is not None else None,
            'token': self.token,
            'call': call,
            'mode': self.mode,
            'enforced': self.enforced,
            'lanes': [[str(state.lane), state.key, state.limit, state.count] for state in self.lanes],
            'full': [str(lane) for lane in self.full],
            'holding': self.holding,
            'lease_ms': self.lease_ms,
            'acquired_ms': self.acquired_ms,
            'retry_after': self.retry_after,
            'suggested': self.suggested,
            'error': self.error,
            'facts': self.facts.to_json(),
        }

    @classmethod
    def from_json(cls, data, token=None):
        """The Admission `to_json` wrote; `{}` (a call the limiter never saw) reads as decision None."""
        data = data or {}
        call = data.get('call')
        if call is not None:
            call = decisions.Call(**{**call, 'draws_on': Lane(call['draws_on']) if call.get('draws_on') else None})
        decision = data.get('decision')
        return cls(
            decision=Decision(decision) if decision else None,
            token=data.get('token') or token or '',
            call=call,
            mode=data.get('mode'),
            enforced=bool(data.get('enforced')),
            lanes=tuple(LaneState(Lane(lane), key, int(limit), None if count is None else int(count))
                        for lane, key, limit, count in data.get('lanes') or ()),
            full=tuple(Lane(lane) for lane in data.get('full') or ()),
            holding=bool(data.get('holding')),
            lease_ms=int(data.get('lease_ms') or 0),
            acquired_ms=int(data.get('acquired_ms') or 0),
            retry_after=data.get('retry_after'),
            suggested=data.get('suggested'),
            error=data.get('error'),
            facts=RequestFacts.from_json(data.get('facts')),
        )


def headers(admission):
    """The X-OCL-Capacity-* headers (and Retry-After when refused); {} when the limiter is off."""
    if admission is None or admission.decision is None:
        return {}
    if admission.decision in (Decision.COALESCED, Decision.CACHED):
        # No lane was taken: no limits or counts of its own, but the suggestion a client sizes its run by.
        values = {HEADER_DECISION: admission.decision, HEADER_SUGGESTED: admission.suggested}
        return {name: str(value) for name, value in values.items() if value is not None}
    limits, counts = admission.limits, admission.counts
    values = {
        HEADER_DECISION: admission.decision,
        HEADER_LIMIT: limits.get(Lane.API_HEAVY),
        HEADER_IN_FLIGHT: counts.get(Lane.API_HEAVY),
        HEADER_TIER: admission.tier,
        HEADER_TIER_LIMIT: limits.get(Lane.TIER),
        HEADER_TIER_IN_FLIGHT: counts.get(Lane.TIER),
        HEADER_SUGGESTED: admission.suggested,
    }
    if admission.refused:
        values['Retry-After'] = admission.retry_after
    return {name: str(value) for name, value in values.items() if value is not None}


def quotas(admission):
    """The admission's lanes as RateLimit quotas (common.ratelimit): each lane a concurrency quota of this
    call's limit there, what is left of it after this call, and for a full lane the seconds until a slot is
    expected to free up (the Retry-After); none when the limiter didn't gate the call."""
    if admission is None or admission.decision in (None, Decision.COALESCED, Decision.CACHED):
        return []
    counts = admission.counts
    result = []
    for state in admission.lanes:
        full = state.lane in admission.full
        result.append(Quota(
            name=str(state.lane), limit=state.limit, unit=CONCURRENT,
            partition=admission.tier if state.lane == Lane.TIER else None,
            remaining=state.limit - counts[state.lane] if counts else None,
            reset=admission.retry_after if full else None))
    return result


def refusal_body(admission):
    """The 429 body of a capacity refusal."""
    return decisions.refusal_body(admission.retry_after, admission.scope, admission.paused)


def log_record(admission, host=''):
    """The admission part of the call's `ocl_capacity` log line (the worker adds the queue part); None
    when the limiter was off for the call."""
    if admission is None or admission.decision is None or admission.call is None:
        return None
    call, limits, counts, facts = admission.call, admission.limits, admission.counts, admission.facts
    semantic = call.semantic
    scope = admission.scope
    return {
        'event': LOG_EVENT,
        'decision': str(admission.decision),
        'mode': admission.mode,
        'enforced': admission.enforced,
        'endpoint': call.endpoint,
        'semantic': call.semantic,
        'reranker': call.reranker,
        'rows': call.rows,
        'single_row': call.single_row,
        'waits': call.waits or None,
        'tier': call.tier,
        'user_id': call.user_id,
        'scope': str(scope) if scope else None,
        'full': [str(lane) for lane in admission.full] or None,
        'in_flight': counts.get(Lane.API_HEAVY),
        'limit': limits.get(Lane.API_HEAVY),
        'task_in_flight': counts.get(Lane.API_HEAVY_TASK),
        'task_limit': limits.get(Lane.API_HEAVY_TASK),
        'es2_knn_in_flight': counts.get(Lane.ES2_KNN) if semantic else None,
        'es2_knn_limit': limits.get(Lane.ES2_KNN) if semantic else None,
        'tier_in_flight': counts.get(Lane.TIER),
        'tier_limit': limits.get(Lane.TIER),
        'user_in_flight': counts.get(Lane.USER),
        'user_limit': limits.get(Lane.USER),
        'suggested': admission.suggested,
        'retry_after': admission.retry_after,
        'queue_ms': facts.queue_ms,
        'error': admission.error,
        'host': call.host or host or None,
        'request_source': facts.request_source,
        'algorithm_id': facts.algorithm_id,
        'automatch_run_id': facts.automatch_run_id,
        'cid': facts.cid,
        'request_id': facts.cid,  # the same id, under the name every other log line uses
        'task_id': admission.token,
    }


def lease_from_message(data, lease_ms, store=None):
    """The Lease of `Admission.worker_lease_message`'s `data`, or None when `data` isn't one. A message
    without `within_limit` (written before it was carried) measures its holds, as it did then."""
    try:
        keys, token = [str(key) for key in data['keys']], str(data['token'])
        holding, acquired_ms = bool(data['holding']), int(data.get('acquired_ms') or 0)
        within_limit = bool(data.get('within_limit', True))
    except (TypeError, KeyError, ValueError):
        return None
    return Lease(keys, token, lease_ms, holding=holding, store=store, acquired_ms=acquired_ms,
                 within_limit=within_limit)
