"""The heavy calls' rate limit: DRF's scoped throttle, failing open when its cache (Redis) fails.

The limiter never refuses a call because it failed itself; the rate limit follows the same rule, so a
hung or unreachable cache lets the call through (and says so in the log) instead of answering 500. Like
the lane store, a process that met a cache error skips the cache for CAPACITY_REDIS_RETRY_SECONDS: a Redis
stall then costs each process one slow rate-limit check, not one per call.
"""
import logging
import math
import time

from django.conf import settings
from rest_framework.throttling import ScopedRateThrottle

from common.ratelimit import Quota

logger = logging.getLogger('heavy_lanes')


RATE_POLICY = 'rate'  # its name in the RateLimit fields


class HeavyRateThrottle(ScopedRateThrottle):
    skip_until = 0.0  # time.monotonic() before which this process doesn't ask the cache (class-wide)
    checked = False   # the cache answered this check (so `history` is this user's)

    def allow_request(self, request, view):
        if time.monotonic() < HeavyRateThrottle.skip_until:
            return True
        try:
            allowed = super().allow_request(request, view)
            self.checked = getattr(self, 'rate', None) is not None and getattr(self, 'key', None) is not None
            return allowed
        except Exception as ex:  # noqa: BLE001 - the cache is down: don't turn that into a 500
            HeavyRateThrottle.skip_until = time.monotonic() + settings.CAPACITY_REDIS_RETRY_SECONDS
            logger.warning('Rate limit not checked (%s: %s); the call goes ahead, and the cache is skipped for '
                           '%s s', type(ex).__name__, ex, settings.CAPACITY_REDIS_RETRY_SECONDS)
            return True

    def quota(self):
        """This check as a RateLimit quota (common.ratelimit): the rate, its window, the requests left in
        it and the seconds until the oldest counted request leaves it; None when the cache wasn't asked
        (no rate, an anonymous caller, or the cache failed open)."""
        if not self.checked:
            return None
        reset = self.duration - (self.now - self.history[-1]) if self.history else self.duration
        return Quota(name=RATE_POLICY, limit=self.num_requests, window=int(self.duration),
                     remaining=self.num_requests - len(self.history), reset=math.ceil(max(reset, 0)))
