"""The gate: take a lease in every lane a heavy call applies to, decide, and hand the leases on.

    gate = CapacityGate(user, endpoint='$match', rows=10, semantic=True, queue='es2_knn', token=task_id)
    gate.acquire()          # never raises
    if gate.refused: ...    # 429 with gate.refusal_body() and gate.headers()
    else: enqueue, and the worker renews and releases gate.lease's lanes

`acquire` runs the policy of capacity.decisions against the lane store, and owns the fail-open rule: the
limiter never refuses because it failed itself; any error of its own makes the decision `unavailable` and
the call goes ahead uncounted (capacity.failopen). In `off` mode nothing is counted and there are no
headers and no log line.
"""
import time
import uuid

from django.conf import settings

from capacity import decisions, failopen
from capacity.caller import get_queue_ms, get_tier, truncate
from capacity.config import get_config
from capacity.constants import (
    HEADER_DECISION, HEADER_IN_FLIGHT, HEADER_LIMIT, HEADER_SUGGESTED, HEADER_TIER, HEADER_TIER_IN_FLIGHT,
    HEADER_TIER_LIMIT, LOG_EVENT, OFF, Decision, Lane,
)
from capacity.keys import lane_key
from capacity.lease import Lease
from capacity.store import RedisLanes


class CapacityGate:
    def __init__(self, user, endpoint, rows=0, semantic=False, reranker=False, waits=False, queue='',
                 metadata=None, token=None, trace_id=None, request_source=None, cid=None):
        self.user = user
        self.endpoint = endpoint
        self.rows = rows
        self.semantic = bool(semantic)
        self.reranker = bool(reranker)
        self.waits = bool(waits)
        self.queue = queue
        self.metadata = metadata or {}
        self.token = token or uuid.uuid4().hex
        self.trace_id = trace_id
        self.request_source = request_source
        self.cid = cid
        self.config = None
        self.call = None
        self.tier = None
        self.lanes = []
        self.keys = []
        self.before = None
        self.counts = {}
        self.full = ()
        self.decision = None  # None: the limiter is off
        self.enforced = False
        self.holding = False
        self.retry_after = None
        self.queue_ms = None
        self.error = None
        self.lease = None
        self.started_at = None

    @classmethod
    def for_request(cls, request, **call):
        """A gate for a DRF request: user, event metadata, trace id and request source from its headers."""
        from capacity.caller import parse_event_metadata
        meta = request.META
        return cls(request.user, metadata=parse_event_metadata(meta.get('HTTP_X_OCL_EVENT_METADATA')),
                   trace_id=meta.get('HTTP_X_AMZN_TRACE_ID'), request_source=meta.get('HTTP_X_OCL_REQUEST_SOURCE'),
                   **call)

    @property
    def refused(self):
        return self.decision == Decision.REFUSED

    @property
    def limits(self):
        return decisions.limits_of(self.lanes)

    @property
    def scope(self):
        return decisions.scope(self.lanes, self.full)

    @property
    def single_row(self):
        return self.endpoint == '$match' and self.rows == 1

    @property
    def lease_ms(self):
        """A queued call's leases last until its queue deadline; the worker then renews by lease_seconds."""
        seconds = self.config['queue']['deadline_seconds'] if self.queue else self.config['lease_seconds']
        return seconds * 1000

    @property
    def task_key(self):
        """The key of this API host's lane, when the call waits in the request, else None."""
        for item, key in zip(self.lanes, self.keys):
            if item.lane == Lane.API_HEAVY_TASK:
                return key
        return None

    def acquire(self):
        self.started_at = time.monotonic()
        self.config = get_config()
        if self.config['mode'] == OFF:
            return self
        try:
            self.queue_ms = get_queue_ms(self.trace_id)
            self.tier = get_tier(self.user)
            self.enforced = decisions.is_enforced(self.config, self.metadata)
            self.call = decisions.Call(
                endpoint=self.endpoint, rows=self.rows, tier=self.tier, user_id=self.user.pk,
                semantic=self.semantic, reranker=self.reranker, waits=self.waits,
                host=settings.CAPACITY_TASK_ID, queue=self.queue)
            self.lanes = decisions.lanes_for(self.config, self.call, enforced=self.enforced)
            self.keys = [lane_key(item.lane, *item.parts) for item in self.lanes]
            if not RedisLanes.is_available():
                self.decision, self.error = Decision.UNAVAILABLE, failopen.SKIPPED
                return self
            acquired = RedisLanes.acquire(self.keys, [item.limit for item in self.lanes], self.token,
                                          self.lease_ms, force=not self.enforced)
            self.holding = acquired.taken
            self.lease = Lease(self.keys, self.token, self.lease_ms, holding=self.holding)
            self.before = acquired.counts
            outcome = decisions.decide(self.lanes, self.before, acquired.taken)
            self.full, self.counts = outcome.full, outcome.counts
            self.decision = outcome.decision
            if self.decision in (Decision.SHADOW_REFUSED, Decision.REFUSED):
                self.retry_after = decisions.retry_after(self.config, self.lanes, self.before, self.full)
        except Exception as ex:  # noqa: BLE001 - the one place acquire fails open
            failopen.record(self, ex, 'acquire')
            if not self.holding or not self.decision:
                # Never refuse on the limiter's own failure.
                self.decision, self.retry_after = Decision.UNAVAILABLE, None
        return self

    def release(self):
        """Release every lease this call took (when it ends in the API: not enqueued, or in tests)."""
        if self.lease is not None:
            self.lease.release()
            self.error = self.error or self.lease.error

    def release_task_lane(self):
        """Stop holding this API host's lane: the request no longer waits for the result."""
        if self.lease is not None and self.task_key:
            self.lease.drop([self.task_key])

    def suggested(self):
        try:
            return decisions.suggested_concurrency(self.lanes, self.counts)
        except Exception as ex:  # noqa: BLE001 - a header must never fail the call
            failopen.record(self, ex, 'suggested concurrency')
            return None

    def refusal_body(self):
        scope = self.scope
        return decisions.refusal_body(self.retry_after, scope, self.limits.get(scope) == 0)

    def headers(self):
        """The X-OCL-Capacity-* headers (and Retry-After when refused); {} when the limiter is off."""
        if self.decision is None:
            return {}
        limits = self.limits
        values = {
            HEADER_DECISION: self.decision,
            HEADER_LIMIT: limits.get(Lane.API_HEAVY),
            HEADER_IN_FLIGHT: self.counts.get(Lane.API_HEAVY),
            HEADER_TIER: self.tier,
            HEADER_TIER_LIMIT: limits.get(Lane.TIER),
            HEADER_TIER_IN_FLIGHT: self.counts.get(Lane.TIER),
            HEADER_SUGGESTED: self.suggested(),
        }
        if self.refused:
            values['Retry-After'] = self.retry_after
        return {name: str(value) for name, value in values.items() if value is not None}

    def apply_headers(self, response):
        if response is None:
            return response
        try:
            for name, value in self.headers().items():
                response[name] = value
        except Exception as ex:  # noqa: BLE001
            failopen.record(self, ex, 'headers')
        return response

    def record(self):
        """The admission part of this call's `ocl_capacity` log line (the worker adds the queue part)."""
        if self.decision is None:
            return None
        limits, counts, semantic = self.limits, self.counts, self.semantic
        return {
            'event': LOG_EVENT,
            'decision': str(self.decision),
            'mode': self.config['mode'],
            'enforced': self.enforced,
            'endpoint': self.endpoint,
            'semantic': self.semantic,
            'reranker': self.reranker,
            'rows': self.rows,
            'single_row': self.single_row,
            'waits': self.waits or None,
            'tier': self.tier,
            'user_id': getattr(self.user, 'pk', None),
            'scope': str(self.scope) if self.scope else None,
            'full': [str(lane) for lane in self.full] or None,
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
            'suggested': self.suggested(),
            'retry_after': self.retry_after,
            'queue_ms': self.queue_ms,
            'error': self.error,
            'host': settings.CAPACITY_TASK_ID,
            'request_source': truncate(self.request_source, 50),
            'algorithm_id': truncate(self.metadata.get('algorithm_id'), 100),
            'automatch_run_id': truncate(self.metadata.get('automatch_run_id'), 20),
            'cid': self.cid,
            'task_id': self.token,
        }
