"""The rate limit of `$match` and `$rerank` calls (lexical and heavy alike): a sliding window per user in
Redis, checked and counted in one Lua script, failing open like the capacity limiter.

Every request of a user under the scope `heavy` (HEAVY_RATE_LIMIT, DRF's rate syntax: 600/min by default)
is counted in one window, `capacity.keys.rate_key('heavy', <user id>)`: a sorted set of the requests of the
last minute, scored by Redis's clock. A request is admitted while fewer than the rate were counted in the
last window, as DRF's scoped throttle decides, and a refused one is not counted (so a client that keeps
retrying gets through as soon as the oldest request leaves the window). The heavy view checks it only once
the capacity gate admitted a call, so a capacity refusal costs no allowance.

Why a script of our own. DRF's throttle reads its history from the cache, then writes it back: requests
that run at once all read the same history, and pass (1,921 of 2,000 concurrent checks against 600/min in
tests/integration/api/test_rate_limit.py). The check and the count must be one atomic step in Redis. The
`limits` library has one (its Redis moving window) but was not used: its `hit` answers only yes or no, so
the RateLimit fields (what is left, when the oldest leaves) would cost a second round trip, not atomic with
the first; it stamps requests with each API host's clock; and it talks to Redis on a client of its own,
outside the lane store's fail-open rule (skip window, one log line) and its Sentinel-aware client with the
limiter's timeouts. `capacity/lua/rate.lua` is a sliding-window log, about twenty lines of Lua, run by the
lane store (`LaneStore.count_request`): one round trip that answers the decision and both fields. A window
holds one member per request counted in it (at most 600 for 600/min), as DRF's history did.

Failing open. The limit never refuses a call because Redis failed: the store's verb applies its one rule
(capacity.store.verb): in the skip window after an error it sends nothing, and an error is recorded once
(capacity.failopen: one log line; a Redis error opens the window, so an outage costs a process one slow
check per window, not one per call); either way it answers Unknown, and the call goes ahead uncounted,
with no RateLimit item for the rate.
"""
import math
import uuid

from rest_framework.throttling import ScopedRateThrottle

from capacity.keys import rate_key
from capacity.store import Unknown, get_store
from common.ratelimit import Quota

RATE_POLICY = 'rate'  # its name in the RateLimit fields


class HeavyRateThrottle(ScopedRateThrottle):
    """DRF's throttle interface (allow_request, wait) on the atomic window; `quota()` for the RateLimit
    fields. One instance checks one request."""

    counted = None  # capacity.operations.Counted, once Redis answered

    def allow_request(self, request, view):
        """Whether the request is within the rate; counts it when it is. Never raises."""
        self.scope = getattr(view, self.scope_attr, None)
        self.rate = self.get_rate() if self.scope else None
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        user = request.user
        ident = user.pk if user is not None and user.is_authenticated else self.get_ident(request)
        counted = get_store().count_request(rate_key(self.scope, ident), uuid.uuid4().hex, self.num_requests,
                                            int(self.duration * 1000))
        if isinstance(counted, Unknown):
            return True  # skipped or failed (recorded by the store): the call goes ahead uncounted
        self.counted = counted
        return counted.admitted

    def wait(self):
        """Seconds until a refused request could be admitted: until the oldest one counted leaves the window."""
        if self.counted is None or self.counted.admitted:
            return None
        return self.counted.reset_ms / 1000

    def quota(self):
        """This check as a RateLimit quota (common.ratelimit): the rate, its window, the requests left in it and
        the seconds until the oldest counted one leaves it; None when Redis wasn't asked (no rate, or the
        limit failed open)."""
        if self.counted is None:
            return None
        return Quota(name=RATE_POLICY, limit=self.num_requests, window=int(self.duration),
                     remaining=self.num_requests - self.counted.in_window,
                     reset=math.ceil(max(self.counted.reset_ms, 0) / 1000))
