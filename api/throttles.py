"""The heavy calls' rate limit: DRF's scoped throttle, failing open when its cache (Redis) fails.

The limiter never refuses a call because it failed itself; the rate limit follows the same rule, so a
hung or unreachable cache lets the call through (and says so in the log) instead of answering 500. Like
the lane store, a process that met a cache error skips the cache for CAPACITY_REDIS_RETRY_SECONDS: a Redis
stall then costs each process one slow rate-limit check, not one per call.
"""
import logging
import time

from django.conf import settings
from rest_framework.throttling import ScopedRateThrottle

logger = logging.getLogger('heavy_lanes')


class HeavyRateThrottle(ScopedRateThrottle):
    skip_until = 0.0  # time.monotonic() before which this process doesn't ask the cache (class-wide)

    def allow_request(self, request, view):
        if time.monotonic() < HeavyRateThrottle.skip_until:
            return True
        try:
            return super().allow_request(request, view)
        except Exception as ex:  # noqa: BLE001 - the cache is down: don't turn that into a 500
            HeavyRateThrottle.skip_until = time.monotonic() + settings.CAPACITY_REDIS_RETRY_SECONDS
            logger.warning('Rate limit not checked (%s: %s); the call goes ahead, and the cache is skipped for '
                           '%s s', type(ex).__name__, ex, settings.CAPACITY_REDIS_RETRY_SECONDS)
            return True
