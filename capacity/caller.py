"""What the limiter reads about the caller: tier, event metadata, and how long the request queued.

Pure helpers over a user object and header strings; nothing here touches Redis.
"""
import json
import time

from django.conf import settings

from capacity.constants import CORE, EARLY_ACCESS, PREVIEW, STAFF

TRACE_MAX_SECONDS = 3600


_tiers = {}  # user id -> (tier, monotonic expiry): one groups query per user per cache period


def get_tier(user):
    """The user's highest plan: staff > core > early_access > preview (the default).

    Group membership is cached per process for CAPACITY_CONFIG_CACHE_SECONDS, like the config: a change
    of plan applies within that time, and a heavy call costs no groups query in the common case.
    """
    if user.is_staff or user.is_superuser:
        return STAFF
    now = time.monotonic()
    cached = _tiers.get(user.pk)
    if cached is not None and cached[1] > now:
        return cached[0]
    groups = set(user.groups.values_list('name', flat=True))
    if settings.CORE_USER_GROUP in groups:
        tier = CORE
    elif settings.EARLY_ACCESS_GROUP in groups:
        tier = EARLY_ACCESS
    else:
        tier = PREVIEW
    if len(_tiers) > 10_000:
        _tiers.clear()  # bound the memory; the next calls refill it
    _tiers[user.pk] = (tier, now + settings.CAPACITY_CONFIG_CACHE_SECONDS)
    return tier


def clear_tiers():
    """Forget cached tiers (tests, and after staff change a user's groups in this process)."""
    _tiers.clear()


def parse_event_metadata(raw):
    """The X-OCL-Event-Metadata JSON object, or {} when it is missing, malformed or not an object."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def get_queue_ms(trace_id, now=None):
    """Milliseconds since the load balancer received the request, read from X-Amzn-Trace-Id.

    The stamp is the second `-` field of Self (else Root), a hex epoch in whole seconds, so the value reads
    up to 1 s high. None when there is no usable stamp or the wait is implausible (< -2 s or >= 1 h).
    """
    if not trace_id:
        return None
    try:
        fields = dict(
            (key.strip(), value.strip())
            for key, value in (part.split('=', 1) for part in str(trace_id).split(';') if '=' in part))
        stamp = fields.get('Self') or fields.get('Root')
        received = int(stamp.split('-')[1], 16)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    waited = (time.time() if now is None else now) - received
    if not -2 < waited < TRACE_MAX_SECONDS:
        return None
    return max(int(waited * 1000), 0)


def truncate(value, length):
    """A header or metadata value as a string of at most `length` characters, or None when empty."""
    if value is None:
        return None
    text = str(value)[:length]
    return text or None
