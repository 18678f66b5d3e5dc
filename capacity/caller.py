"""What the limiter reads about the caller: tier, and the facts a request's headers carry.

`RequestFacts.from_meta(request.META)` reads every header the limiter uses — `X-OCL-Event-Metadata`
(capacity_aware, algorithm_id, automatch_run_id), `X-Amzn-Trace-Id` (queue_ms), `X-OCL-Request-Source`
and the request id — with total functions: whatever a client sends, they return a value and never raise,
so nothing a client sends can reach the gate's fail-open path. Malformed, oversized or deeply nested
values read as absent, and so do values a database can't store (NUL, unpaired surrogates). The one value
a heavy call refuses instead is an `automatch_run_id` over MAX_RUN_CHARS (`run_id_too_long`, a 400 in
api.views): cut short, it would name another run, or none the client could filter or cancel by.
"""
import json
import math
import time
from dataclasses import asdict, dataclass

from django.conf import settings

from capacity.constants import CAPACITY_AWARE_KEY, CORE, EARLY_ACCESS, PREVIEW, STAFF

TRACE_MAX_SECONDS = 3600
MAX_METADATA_BYTES = 16 * 1024  # a larger X-OCL-Event-Metadata reads as {}
MAX_TRACE_CHARS = 256
MAX_STAMP_HEX = 12  # a hex epoch in seconds has 8 digits until 2106; more is not a time stamp
AWARE_VALUES = ('true', '1')
# The longest `automatch_run_id` kept (workers.models.Call.run_id): a longer one is the heavy call's 400
# (api.views), not cut short, since a run is found again by exactly the id its client sent.
MAX_RUN_CHARS = 255

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
    """The X-OCL-Event-Metadata JSON object, or {} when it is missing, malformed, too big or not an object."""
    if not raw or not isinstance(raw, str) or len(raw) > MAX_METADATA_BYTES:
        return {}
    try:
        value = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def is_aware(metadata):
    """Whether the metadata says the client handles a capacity 429: JSON true, 1, "true", "True", "1"."""
    value = metadata.get(CAPACITY_AWARE_KEY)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value == 1
    return isinstance(value, str) and value.lower() in AWARE_VALUES


def get_queue_ms(trace_id, now=None):
    """Milliseconds since the load balancer received the request, read from X-Amzn-Trace-Id.

    The stamp is the second `-` field of Self (else Root), a hex epoch in whole seconds, so the value reads
    up to 1 s high. None when there is no usable stamp or the wait is implausible (< -2 s or >= 1 h).
    """
    if not trace_id or not isinstance(trace_id, str) or len(trace_id) > MAX_TRACE_CHARS:
        return None
    try:
        fields = {
            key.strip(): value.strip()
            for key, value in (part.split('=', 1) for part in trace_id.split(';') if '=' in part)}
        stamp = (fields.get('Self') or fields.get('Root') or '').split('-')[1]
        if not 0 < len(stamp) <= MAX_STAMP_HEX:
            return None
        received = int(stamp, 16)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None
    waited = (time.time() if now is None else now) - received
    if not math.isfinite(waited) or not -2 < waited < TRACE_MAX_SECONDS:
        return None
    return max(int(waited * 1000), 0)


def truncate(value, length):
    """A header or metadata value as a string of at most `length` characters, or None when empty.

    Only scalars are kept: a nested object or list in the metadata is not an id, and reads as absent. So
    does text a database can't store (a NUL, an unpaired surrogate: JSON escapes can make either), which
    would otherwise fail the call's row when it is written.
    """
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value)[:length]
    if not text or '\x00' in text:
        return None
    try:
        text.encode('utf-8')
    except UnicodeEncodeError:
        return None
    return text


def run_id_too_long(meta):
    """Whether the request's X-OCL-Event-Metadata names an `automatch_run_id` longer than MAX_RUN_CHARS
    (which RequestFacts would cut short). Never raises."""
    raw = meta.get('HTTP_X_OCL_EVENT_METADATA')
    if not raw or not isinstance(raw, str) or len(raw) <= MAX_RUN_CHARS:
        return False  # a header this short can't hold a longer id: no parse on the common path
    run = truncate(parse_event_metadata(raw).get('automatch_run_id'), MAX_RUN_CHARS + 1)
    return run is not None and len(run) > MAX_RUN_CHARS


@dataclass(frozen=True)
class RequestFacts:
    """What the request's headers tell the limiter and its log line, already parsed and bounded."""

    aware: bool = False               # "capacity_aware": the client handles a capacity 429
    queue_ms: int | None = None       # time the request waited before the API saw it
    request_source: str | None = None
    algorithm_id: str | None = None
    automatch_run_id: str | None = None
    cid: str | None = None            # the request id (X-Request-Id)

    @classmethod
    def from_meta(cls, meta, now=None):
        """The facts of a WSGI environ / request.META. Never raises."""
        metadata = parse_event_metadata(meta.get('HTTP_X_OCL_EVENT_METADATA'))
        return cls(
            aware=is_aware(metadata),
            queue_ms=get_queue_ms(meta.get('HTTP_X_AMZN_TRACE_ID'), now),
            request_source=truncate(meta.get('HTTP_X_OCL_REQUEST_SOURCE'), 50),
            algorithm_id=truncate(metadata.get('algorithm_id'), 100),
            automatch_run_id=truncate(metadata.get('automatch_run_id'), MAX_RUN_CHARS),
            cid=truncate(meta.get('HTTP_X_REQUEST_ID'), 100),
        )

    def to_json(self):
        return asdict(self)

    @classmethod
    def from_json(cls, data):
        return cls(**{key: value for key, value in (data or {}).items() if key in cls.__dataclass_fields__})


NO_FACTS = RequestFacts()
