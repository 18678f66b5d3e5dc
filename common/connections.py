"""The one Redis client factory: every Redis connection of the service is made here, Sentinel-aware.

    client = connect('lanes')                       # the main Redis (REDIS_URL, or the Sentinels' master)
    broker = connect('status', url=settings.CELERY_BROKER_URL)

A *role* names what the connection is for and so its timeouts (ROLES, the one timeout table). The main
Redis is `REDIS_URL` (or its parts), or, with `REDIS_SENTINELS`, whatever master the Sentinels name now:
`master_for` asks them on every new connection, so every role follows a failover. A `url` that names
another Redis (a separate broker or cache) is connected to directly; one on the main Redis's host and port
keeps Sentinel and uses that URL's database.

Clients are kept per process (common.process), one per role and database: a `redis.Redis` is safe to share
between threads (each command takes a pooled connection) and its pool reconnects in a forked child.
Retries are off for every role: a caller that needs one decides (the lane store never retries; its callers
fail open).
"""
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from common.process import PerProcess


@dataclass(frozen=True)
class Timeouts:
    socket: float
    connect: float


def lanes_timeouts():
    """The limiter's own: short, and set by CAPACITY_REDIS_TIMEOUT_SECONDS (LIMITER.md §2.6). A read never
    outlasts the deadline either, since lane operations on an established connection run on their
    caller's thread with nothing else to stop them (capacity.store)."""
    seconds = settings.CAPACITY_REDIS_TIMEOUT_SECONDS
    return Timeouts(min(seconds, settings.CAPACITY_REDIS_DEADLINE_SECONDS), seconds)


# What each connection is for, and how long it may wait for Redis (seconds).
ROLES = {
    'lanes': lanes_timeouts,                 # lease lanes, counters, idempotency and work claims
    'notices': lambda: Timeouts(1.0, 1.0),   # completion notices (pub/sub) for waiting requests
    'cache': lambda: Timeouts(1.0, 1.0),     # Django's cache (api.cache)
    'status': lambda: Timeouts(2.0, 2.0),    # status and metrics reads, queue depth on the broker
    'broker': lambda: Timeouts(2.0, 2.0),    # the sweep's and cancel's look into the broker's lists
    'pools': lambda: Timeouts(5.0, 2.0),     # the pool reconciler's heartbeats and pool registry
}


class UnknownRole(LookupError):
    pass


def options(role):
    """redis-py keyword arguments for `role`: its timeouts, no retries, no health checks."""
    try:
        timeouts = ROLES[role]()
    except KeyError:
        raise UnknownRole(f'No Redis role "{role}"; the roles are {", ".join(ROLES)}.') from None
    return {'socket_timeout': timeouts.socket, 'socket_connect_timeout': timeouts.connect,
            'retry': Retry(NoBackoff(), 0), 'health_check_interval': 0}


def _is_main(url):
    """Whether `url` names the main Redis (same host and port; its database may differ)."""
    if url is None:
        return True
    parts = urlsplit(url)
    return (parts.scheme in ('redis', 'rediss', 'sentinel') and (parts.hostname or '127.0.0.1') == settings.REDIS_HOST
            and (parts.port or 6379) == int(settings.REDIS_PORT))


def _database(url):
    if url is None:
        return settings.REDIS_DB
    path = urlsplit(url.split(';', 1)[0]).path.lstrip('/')  # kombu joins Sentinel URLs with ';'
    return int(path) if path.isdigit() else 0


def build(role, url=None):
    """A new client for `role` (not kept): the main Redis through Sentinel when configured, else `url`."""
    kwargs = options(role)
    if settings.REDIS_SENTINELS and (url is None or _is_main(url) or url.startswith('sentinel://')):
        sentinel_kwargs = {key: kwargs[key] for key in ('socket_timeout', 'socket_connect_timeout', 'retry')}
        if settings.REDIS_PASSWORD:
            sentinel_kwargs['password'] = settings.REDIS_PASSWORD
        sentinel = Sentinel(settings.REDIS_SENTINELS_LIST, sentinel_kwargs=sentinel_kwargs)
        return sentinel.master_for(settings.REDIS_SENTINELS_MASTER, db=_database(url),
                                   password=settings.REDIS_PASSWORD, **kwargs)
    if url is None:
        return redis.Redis(host=settings.REDIS_HOST, port=int(settings.REDIS_PORT), db=settings.REDIS_DB,
                           password=settings.REDIS_PASSWORD, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


_clients = PerProcess(dict)  # (role, url) -> client, in this process


def connect(role, url=None):
    """This process's client for `role` on `url` (default: the main Redis), made on first use."""
    clients = _clients.get()
    key = (role, url or settings.REDIS_URL)
    client = clients.get(key)
    if client is None:
        client = clients.setdefault(key, build(role, url))
    return client


def forget():
    """Drop this process's clients (tests that point the settings at another Redis)."""
    _clients.clear()
