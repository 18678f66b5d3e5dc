"""The IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers-11): `RateLimit-Policy` and
`RateLimit`, two Structured Field lists (RFC 9651), rendered from quota values.

    RateLimit-Policy: "es2_knn";q=2;qu="concurrent-requests", "rate";q=600;w=60
    RateLimit: "es2_knn";r=0;t=2, "rate";r=599;t=60

A policy item names a quota (a String) with its size `q`, its unit `qu` (left out for the default,
"requests"), its window `w` in seconds (none for a concurrency limit) and a partition key `pk` (a Byte
Sequence) when the quota is one of several of that name. A service-limit item gives what is left now, `r`,
and `t`, the seconds within which no more than `r` may be used (for a full concurrency lane: until a slot
is expected to free up, the refusal's Retry-After). The lane limiter and the rate limit both make
`Quota` values; the view renders them into one pair of fields.
"""
from dataclasses import dataclass

import http_sf

POLICY_HEADER = 'RateLimit-Policy'
LIMIT_HEADER = 'RateLimit'
CONCURRENT = 'concurrent-requests'
REQUESTS = 'requests'


@dataclass(frozen=True)
class Quota:
    """One quota policy and, when it was counted, what is left of it now."""

    name: str
    limit: int
    unit: str = REQUESTS
    window: int | None = None       # seconds; None for a concurrency limit
    partition: str | None = None    # sent as `pk` (its UTF-8 bytes)
    remaining: int | None = None    # None: not counted (no RateLimit item)
    reset: int | None = None        # seconds (`t`); None: not said


def _params(quota, names):
    values = {
        'q': quota.limit, 'qu': quota.unit if quota.unit != REQUESTS else None, 'w': quota.window,
        'r': None if quota.remaining is None else max(quota.remaining, 0),
        't': None if quota.reset is None else max(int(quota.reset), 0),
        'pk': quota.partition.encode() if quota.partition is not None else None,
    }
    return {name: values[name] for name in names if values[name] is not None}


def fields(quotas):
    """{header: value} for `quotas` (empty when there are none)."""
    quotas = [quota for quota in quotas if quota is not None]
    if not quotas:
        return {}
    headers = {POLICY_HEADER: http_sf.ser([(quota.name, _params(quota, ('q', 'qu', 'w', 'pk')))
                                          for quota in quotas])}
    counted = [quota for quota in quotas if quota.remaining is not None]
    if counted:
        headers[LIMIT_HEADER] = http_sf.ser([(quota.name, _params(quota, ('r', 't', 'pk')))
                                             for quota in counted])
    return headers
