"""What a load run is: its target (loopback only), its tokens and their tiers, the mix of calls, and the
bounds on users, time and waits, all checked before anything is sent.

    plan = LoadPlan(url='http://127.0.0.1:8000', users=8, seconds=30,
                    accounts=(Account('core', 'KEY1'), Account('preview', 'KEY2')))

Tokens come from a file (`{"tokens": [{"token": "...", "tier": "core"}, ...]}`, read_accounts) or from
`--token TIER:KEY` (parse_token_arg); the mix from `single=5,bulk=3,...` (parse_mix).
"""
import ipaddress
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit

TIERS = ('staff', 'core', 'early_access', 'preview')
KINDS = ('single', 'bulk', 'bulk-rerank', 'rerank')
DEFAULT_MIX = (('single', 5), ('bulk', 3), ('bulk-rerank', 1), ('rerank', 1))
MAX_USERS = 256
MAX_SECONDS = 3600
MAX_DRAIN_SECONDS = 600


def require_loopback(url):
    """ValueError unless `url` is http(s) to a loopback host."""
    parts = urlsplit(url)
    host = parts.hostname or ''
    if parts.scheme not in ('http', 'https') or not host:
        raise ValueError(f'not an http(s) URL: {url!r}')
    if host == 'localhost':
        return url
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f'the load generator only targets loopback addresses (127.0.0.0/8, ::1, localhost), '
                         f'not {host!r}')
    return url


@dataclass(frozen=True)
class Account:
    tier: str
    token: str = field(repr=False)

    def __post_init__(self):
        if self.tier not in TIERS:
            raise ValueError(f'unknown tier {self.tier!r}; the tiers are {", ".join(TIERS)}')
        if not self.token:
            raise ValueError('empty token')


def parse_token_arg(text):
    """`--token TIER:KEY`."""
    tier, sep, token = text.partition(':')
    if not sep:
        raise ValueError(f'expected TIER:KEY, got {text!r}')
    return Account(tier.strip(), token.strip())


def read_accounts(path):
    """A tokens file: {"tokens": [{"token": "...", "tier": "core"}, ...]} (or just the list)."""
    with open(path, encoding='utf-8') as handle:
        data = json.load(handle)
    items = data.get('tokens') if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise ValueError(f'{path}: expected {{"tokens": [{{"token": ..., "tier": ...}}, ...]}}')
    accounts = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get('token'), str):
            raise ValueError(f'{path}: each token needs "token" and "tier"')
        accounts.append(Account(str(item.get('tier', '')), item['token']))
    return accounts


def parse_mix(text):
    """`single=5,bulk=3,rerank=1` -> (("single", 5), ...)."""
    pairs = []
    for part in text.split(','):
        if not part.strip():
            continue
        kind, _, weight = part.partition('=')
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f'unknown kind {kind!r}; the kinds are {", ".join(KINDS)}')
        try:
            value = float(weight)
        except ValueError:
            raise ValueError(f'bad weight in {part!r}') from None
        if value < 0:
            raise ValueError(f'negative weight in {part!r}')
        pairs.append((kind, value))
    if not pairs or not any(weight > 0 for _, weight in pairs):
        raise ValueError('the mix needs at least one kind with a positive weight')
    return tuple(pairs)


@dataclass(frozen=True)
class LoadPlan:
    url: str
    accounts: tuple
    users: int = 8
    seconds: float = 30.0
    source: str | None = None          # for $match calls; default: the first of GET /sources/
    mix: tuple = DEFAULT_MIX
    bulk_rows: int = 10
    staff_token: str | None = field(default=None, repr=False)
    sample_interval: float = 0.075     # seconds between /capacity/status/ samples
    drain_seconds: float = 30.0        # after `seconds`: time for calls in flight to finish, then cancel
    max_backoff: float = 30.0          # cap on a user's wait after a 429
    think_seconds: float = 0.2         # a user's pause between calls: U(0, think_seconds)
    long_poll: int = 10
    submit_wait: bool = True           # the POST itself waits up to long_poll (Prefer: respond-async, wait=N)
    http_timeout: float = 15.0         # read timeout of one request (a long poll adds its wait)
    seed: int | None = None

    def __post_init__(self):
        require_loopback(self.url)
        if not self.accounts:
            raise ValueError('give at least one token')
        if not 1 <= self.users <= MAX_USERS:
            raise ValueError(f'users must be 1..{MAX_USERS}')
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f'seconds must be in (0, {MAX_SECONDS}]')
        if not 0 <= self.drain_seconds <= MAX_DRAIN_SECONDS:
            raise ValueError(f'drain_seconds must be 0..{MAX_DRAIN_SECONDS}')
        if not 0.05 <= self.sample_interval <= 1.0:
            raise ValueError('sample_interval must be 0.05..1.0 s')
        if not 1 <= self.bulk_rows <= 1000:
            raise ValueError('bulk_rows must be 1..1000')
        if self.max_backoff < 0 or self.think_seconds < 0 or self.long_poll < 0 or self.http_timeout <= 0:
            raise ValueError('waits must not be negative')
