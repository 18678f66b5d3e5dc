"""Redis key names for the lease lanes: one helper, one prefix, one hash slot.

Every key is `{<CAPACITY_KEY_PREFIX>}:<lane>[:<part>...]`, e.g. `{ocl:capacity}:api_heavy`,
`{ocl:capacity}:user:42`, `{ocl:capacity}:api_heavy_task:<host>`. The braces are a Redis Cluster hash tag:
Cluster hashes only the text between the first `{` and the next `}`, so every key of one prefix lands in one
slot and the multi-key Lua scripts (a call's lanes plus the expired counter) run on any Redis, Cluster too.

The prefix is read from settings on every call (tests give each test its own prefix); the keys built from
it are remembered, because every admission needs five or six of them (bench/admission.py).
"""
import enum

from django.conf import settings

# Redis SCAN MATCH glob specials; a backslash escapes them.
GLOB_SPECIALS = frozenset('*?[]\\')
STATS_LANE = 'stats'


def get_tag(prefix=None):
    """The hash-tagged prefix, `{<prefix>}` (`prefix`: the settings' when None). Raises ValueError when the
    prefix would break the tag."""
    prefix = settings.CAPACITY_KEY_PREFIX if prefix is None else prefix
    # An empty tag (`{}`) makes Redis hash the whole key, and a brace inside the prefix ends or shifts the
    # tag: either would scatter one call's lanes over several Cluster slots.
    if not prefix or '{' in prefix or '}' in prefix:
        raise ValueError(f'CAPACITY_KEY_PREFIX must be non-empty and free of braces, not {prefix!r}')
    return '{' + prefix + '}'


def lane_name(lane):
    """The text of a lane: a `capacity.constants.Lane` gives its value, anything else its str()."""
    return lane.value if isinstance(lane, enum.Enum) else str(lane)


MAX_REMEMBERED_KEYS = 10_000
_keys = {}  # (prefix, lane, parts) -> key


def lane_key(lane, *parts, prefix=None):
    """The key of one lane, e.g. lane_key(Lane.USER, 42) == '{ocl:capacity}:user:42' (`prefix`: the
    settings' when None)."""
    prefix = settings.CAPACITY_KEY_PREFIX if prefix is None else prefix
    remembered = (prefix, lane, parts)
    key = _keys.get(remembered)
    if key is None:
        key = ':'.join([get_tag(prefix), lane_name(lane), *(str(part) for part in parts)])
        if len(_keys) >= MAX_REMEMBERED_KEYS:
            _keys.clear()  # bound the memory; the next calls refill it
        _keys[remembered] = key
    return key


def counters_key(prefix=None):
    """The hash of cluster-wide event counters (capacity.counters)."""
    return lane_key(STATS_LANE, 'counters', prefix=prefix)


def decisions_minute_key(minute, prefix=None):
    """The hash of one minute's decisions (capacity.counters: `decision -> count`), `minute` being whole
    minutes since the epoch; it expires an hour after its minute (counters.SERIES_MINUTES)."""
    return lane_key(STATS_LANE, 'decisions', minute, prefix=prefix)


def expired_key():
    """The plain counter of leases that expired without a release (acquire adds the leases it prunes)."""
    return lane_key(STATS_LANE, 'expired')


def holds_key():
    """The hash of measured times (capacity.holds): how long leases are held per lane, how long calls run
    per queue. Release updates it; acquire reads it when a lane is full (both in their own script)."""
    return lane_key(STATS_LANE, 'holds')


# Lanes with a key per user or per API host: their hold times are measured together, one field per lane,
# so the hash stays as small as the set of lanes (100,000 users would otherwise mean 100,000 fields).
POOLED_LANES = frozenset({'user', 'api_heavy_task'})


_fields = {}  # lane key -> its field (every acquire names one per lane)


def hold_field(key):
    """The field of `holds_key()` that measures the lane `key` holds, e.g. 'es2_knn', 'tier:preview',
    'user' (every user's lane together)."""
    field = _fields.get(key)
    if field is None:
        text = key.decode() if isinstance(key, bytes) else key
        name = text.split('}:', 1)[-1]
        lane = name.split(':', 1)[0]
        field = lane if lane in POOLED_LANES else name
        if len(_fields) >= MAX_REMEMBERED_KEYS:
            _fields.clear()  # bound the memory; the next calls refill it
        _fields[key] = field
    return field


RATE_LANE = 'rate'


def rate_key(scope, ident):
    """The sliding window of one caller's requests under the rate limit `scope` (capacity/lua/rate.lua), e.g.
    rate_key('heavy', 42) == '{ocl:capacity}:rate:heavy:42'. Not a lease lane: a sorted set of requests."""
    return lane_key(RATE_LANE, scope, ident)


def run_field(queue):
    """The field of `holds_key()` that measures how long the calls of `queue` run."""
    return f'run:{queue}'


def escape_glob(text):
    return ''.join('\\' + char if char in GLOB_SPECIALS else char for char in text)


def lane_pattern(lane):
    """The SCAN MATCH pattern for every key of a lane with parts, e.g. '{ocl:capacity}:user:*'."""
    return escape_glob(lane_key(lane) + ':') + '*'


def lane_id(key):
    """The part of a key after its last ':' (a user id, a host); bytes are decoded as UTF-8."""
    if isinstance(key, bytes):
        key = key.decode()
    return key.rsplit(':', 1)[-1]


# Not lane keys (no hash tag: they are never in a script with the lanes), under the same prefix.

def nodes_key(queue):
    """The sorted set of live worker nodes serving `queue`, scored by heartbeat expiry (workers.pool)."""
    return f'{settings.CAPACITY_KEY_PREFIX}:nodes:{queue}'


def pool_key(queue):
    """The hash of what each node serving `queue` last published about its pool (workers.pool)."""
    return f'{settings.CAPACITY_KEY_PREFIX}:pool:{queue}'


def notice_channel(work_id):
    """The pub/sub channel a work's end is announced on (workers.notify). Not under the prefix: work ids
    are unique on their own, and every process agrees."""
    return f'heavy-lanes:done:{work_id}'


def process_notice_channel(host, pid, nonce):
    """The pub/sub channel of one API process's own notices (workers.notify.Hub.own): the ends of the works
    its waiting requests published. Outside notice_channel's pattern, so no other process hears them."""
    return f'heavy-lanes:notices-to:{host}:{pid}:{nonce}'


def invalidation_channel():
    """The pub/sub channel a change to a fact API processes keep is announced on (workers.local_cache). Like
    the notices', not under the key prefix: every process hears it, whatever prefix it uses.
    HEAVY_LANES_INVALIDATION_CHANNEL keeps deployments (or test runs) that share one Redis apart."""
    return settings.HEAVY_LANES_INVALIDATION_CHANNEL


def claim_key(kind, *parts):
    """A short-lived claim that one request is doing something for everyone (e.g. kind `idempotency`,
    parts user id and the key's digest), so racing requests wait for it instead of doing it twice."""
    return f'{settings.CAPACITY_KEY_PREFIX}:claim:{kind}:' + ':'.join(str(part) for part in parts)


def work_claim_key(work_key):
    """Names the open work of the key `work_key` while identical calls may join it (workers.sharing)."""
    return claim_key('work', work_key)


def warm_key(work_key):
    """The succeeded work whose stored result answers identical calls for cache.ttl_seconds (workers.sharing)."""
    return f'{settings.CAPACITY_KEY_PREFIX}:warm:{work_key}'
