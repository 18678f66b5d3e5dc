"""The lane store: the limiter's one way to Redis, as named verbs that fail open.

    store = get_store()
    acquired = store.acquire(keys, limits, token, lease_ms, force=False)
    if isinstance(acquired, Unknown):   # Redis was skipped or failed: the call goes ahead uncounted
        ...

Every verb follows one rule, applied here once (`verb`), never at its call sites:
1. while the skip window is open (a Redis error met lately: `mark_unavailable`), send nothing;
2. on an error, record it (logged once, with the verb's name: capacity.failopen) and open the skip window
   when it shows Redis can't serve, or when the probe then finds no answer (an error that may be this
   process's own slowness);
3. return the declared default instead of raising: `Unknown(error)`, which is falsy and says why
   (`skipped` when it was the window). A bug in the call itself (`BadCall`) is raised, never hidden.
A verb that leaves something behind when its outcome is unknown undoes it the same way every time: an
acquire that timed out or lost its connection (Redis may still run it from its input buffer) and a release
that didn't reach Redis are released again once Redis answers (capacity.releases).

| verb | does (units) | atomic | returns |
|---|---|---|---|
| `acquire` | a lease in every lane or none (ms) | one script | `Acquired` |
| `renew` | every lease of a token to `lease_ms` from now, if all are held | one script | leases held |
| `release` | a token's leases; measures holds and run time | one script | leases removed |
| `release_and_end` | `release`, a completion notice, a work's claim given up | one pipeline | `Ended` |
| `count` | unexpired leases per lane | one script | [int] |
| `count_request` | a request in its rate window if under `limit` in `window_ms` ms | one script | `Counted` |
| `counted` | whether any lane still counts a token (by Redis's clock) | one pipeline | bool |
| `find_keys` | every key of a lane with parts | SCAN | [str] |
| `claim` | a string key naming who does a work for everyone, for ms | SET NX PX | taken (bool) |
| `unclaim` | give a claim up if still held; maybe point a key at it | one script | was held (bool) |
| `keep` / `read` | a claim kept for s; who holds some claims | one command | bool / [str or None] |
| `holds` / `hold` | measured mean holds and run times (ms) | one command | dict / int or None |
| `expired_total` | leases that expired unreleased | one command | int |
| `counters` | the event counters hash | one command | dict |
| `add_counts_later` | increments, sent from the Redis thread | one pipeline | True when queued |
| `decision_counts` | decisions per minute, for the minutes asked (capacity.counters) | one pipeline | [dict] |
| `probe` | PING, even in the skip window; an answer closes it | one command | True |

Which operation runs where, within the deadline, is capacity.runner's; the operations themselves are
capacity.operations' (the contract suite tests them on fakeredis and the real Redis). `get_store()` is this
process's store; tests give their own with `use_store(LaneStore(client))`.

Model: limits' `limits/storage/base.py` (errors handled once per verb) and dramatiq's rate-limit backend
(`dramatiq/rate_limits/backend.py`: a short contract of verbs).
"""
import functools
import time
from dataclasses import dataclass

import redis
from django.conf import settings

from capacity import failopen
from capacity.breaker import Prober
from capacity.operations import BadCall, Operations
from capacity.releases import DeferredReleases
from capacity.runner import Runner, Unsent
from capacity.threads import Busy
from common import connections
from common.process import PerProcess

# Errors after which Redis may still have run what was sent (it sits in Redis's input buffer).
UNKNOWN_OUTCOME = (redis.TimeoutError, redis.ConnectionError)
# Errors that a busy or starved process meets with Redis answering fine: only the probe may open the window.
AMBIGUOUS = (Unsent, Busy)


@dataclass(frozen=True)
class Unknown:
    """What a verb returns when Redis was skipped or failed: the outcome is unknown. Falsy."""

    error: str
    skipped: bool = False  # the skip window was open: nothing was sent

    def __bool__(self):
        return False


SKIPPED = Unknown(failopen.SKIPPED, skipped=True)


@dataclass(frozen=True)
class Undo:
    """What a verb may have left behind when its outcome is unknown, and how it is taken back: `take_back(store,
    *args, **kwargs)` with the verb's own arguments, after every failure and skip (`always`), or only after
    an error that leaves the outcome unknown (UNKNOWN_OUTCOME)."""

    take_back: object
    always: bool


def _release_later(store, keys, token, *args, **kwargs):
    store.releases.defer(keys, token)


def _release_acquire_later(store, keys, limits, token, *args, **kwargs):
    store.releases.defer(keys, token)


def _release_all_later(store, ends, *args, **kwargs):
    for keys, token, *_ in ends:
        store.releases.defer(keys, token)


RELEASE_LATER = Undo(_release_later, always=True)
RELEASE_ALL_LATER = Undo(_release_all_later, always=True)
RELEASE_UNKNOWN_ACQUIRE = Undo(_release_acquire_later, always=False)


def verb(action, undo=None):
    """Apply the fail-open rule to one verb (see the module docstring), with its Undo."""
    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            if not self.is_available():
                if undo is not None and undo.always:
                    undo.take_back(self, *args, **kwargs)
                return SKIPPED
            try:
                return method(self, *args, **kwargs)
            except BadCall:
                raise
            except Exception as ex:  # noqa: BLE001 - the one place a Redis operation fails open
                error = failopen.record(ex, action, self)
                if undo is not None and (undo.always or isinstance(ex, UNKNOWN_OUTCOME)):
                    undo.take_back(self, *args, **kwargs)
                return Unknown(error)
        return run
    return wrap


def build_redis_client():
    """The limiter's own client: short timeouts, no retries, no health checks; Sentinel when configured."""
    return connections.build('lanes')


class LaneStore:
    """The lanes in Redis, for one process: its operations, its skip window, the releases it still owes."""

    def __init__(self, client=None):
        self.runner = Runner(client, build_redis_client)  # client None: built from settings on first use
        self.ops = Operations(self.runner)
        self.unavailable_until = 0.0  # time.monotonic() before which Redis is skipped
        self.releases = DeferredReleases(self)
        self.prober = Prober(self)  # closes the window once Redis answers (capacity.breaker)

    # --- the skip window

    def is_available(self):
        return time.monotonic() >= self.unavailable_until

    def suspect(self, ex):
        """After the Redis error `ex`: open the skip window when it shows Redis can't serve; when it may be
        this process's own slowness (Unsent, Busy), ask the probe, which opens it only if Redis doesn't
        answer either (capacity.failopen)."""
        if isinstance(ex, AMBIGUOUS):
            self.prober.verify()
        else:
            self.mark_unavailable()

    def mark_unavailable(self):
        """Skip Redis for at most CAPACITY_REDIS_RETRY_SECONDS, so an outage costs each process one slow call:
        the window closes sooner, once a probe off the request path sees Redis answer (capacity.breaker)."""
        self.open_window()
        self.prober.start()

    def open_window(self):
        """Skip Redis for at most CAPACITY_REDIS_RETRY_SECONDS (the probe that opens it goes on itself)."""
        self.unavailable_until = time.monotonic() + settings.CAPACITY_REDIS_RETRY_SECONDS

    # --- lanes

    @verb('acquire', undo=RELEASE_UNKNOWN_ACQUIRE)
    def acquire(self, keys, limits, token, lease_ms, force, not_after_ms=None):
        """Take a lease (`lease_ms` ms) in every lane of `keys` or in none (capacity.operations)."""
        return self.ops.acquire(keys, limits, token, lease_ms, force, not_after_ms)

    @verb('renewal')
    def renew(self, keys, token, lease_ms):
        """Move every lease of `token` to expire `lease_ms` ms from now, only if all are held; return held."""
        return self.ops.renew(keys, token, lease_ms)

    @verb('release', undo=RELEASE_LATER)
    def release(self, keys, token, acquired_ms=0, ran=None, within_limit=True):
        """Remove the leases of `token` (measuring each lane's hold when `within_limit` and, with `ran`, the
        run); how many."""
        return self.ops.release(keys, token, acquired_ms, ran, within_limit)

    @verb('release', undo=RELEASE_LATER)
    def release_and_end(self, keys, token, acquired_ms=0, ran=None, notice=None, work=None, within_limit=True):
        """A run's end in one round trip (capacity.operations.Operations.release_and_end): an Ended. A
        release that failed alone is sent again later, as any release; a notice that didn't go is the
        caller's to send."""
        ended = self.ops.release_and_end(keys, token, acquired_ms, ran, notice, work, within_limit)
        if isinstance(ended.removed, Exception):
            failopen.record(ended.removed, 'release', self)
            self.releases.defer(keys, token)
        return ended

    @verb('release', undo=RELEASE_ALL_LATER)
    def release_and_end_all(self, ends):
        """`release_and_end` for many ends ((keys, token, acquired_ms, ran, notice, work, within_limit) each) in
        one round trip: an Ended each, in order. A release that failed alone is sent again later, as any release."""
        ended = self.ops.release_and_end_all(ends)
        for (keys, token, *_), one in zip(ends, ended):
            if isinstance(one.removed, Exception):
                failopen.record(one.removed, 'release', self)
                self.releases.defer(keys, token)
        return ended

    @verb('count')
    def count(self, keys):
        """Each lane's unexpired leases, in `keys` order (nothing is pruned)."""
        return self.ops.count(keys)

    @verb('lease probe')
    def counted(self, keys, token):
        """Whether any lane of `keys` still counts `token` (an unexpired lease by Redis's clock). Reads only."""
        now_ms, scores = self.ops.scores(keys, token)
        return any(score is not None and float(score) > now_ms for score in scores)

    @verb('key scan')
    def find_keys(self, lane):
        """Every key of a lane that has parts (e.g. each host's api_heavy_task key), sorted."""
        return self.ops.find_keys(lane)

    # --- the rate limit (api.throttles)

    @verb('rate limit')
    def count_request(self, key, token, limit, window_ms):
        """Count the request `token` in the sliding window `key` if fewer than `limit` (requests) were counted
        in its last `window_ms` (ms, by Redis's clock), in one script: a Counted (admitted, requests in the
        window, ms until the oldest leaves it). Skipped or failed: Unknown; the caller admits uncounted."""
        return self.ops.count_request(key, token, limit, window_ms)

    # --- claims: one request does a piece of work for everyone (shared work, Idempotency-Keys)

    @verb('claim')
    def claim(self, key, token, ms):
        """Take the claim `key` for `token` for `ms` ms unless another holds it; True when taken."""
        return self.ops.claim(key, token, ms)

    @verb('unclaim')
    def unclaim(self, key, token, pointer_key=None, pointer_ms=0):
        """Give up the claim `key` if `token` holds it (True when it did); with `pointer_key`, point it at
        `token` for `pointer_ms` ms in the same script."""
        return self.ops.unclaim(key, token, pointer_key, pointer_ms)

    @verb('claim keep')
    def keep(self, key, seconds, value=None):
        """Keep the claim `key` for `seconds` s from now (holding `value` instead of its token when given);
        True when it existed."""
        return self.ops.keep(key, seconds, value)

    @verb('claim read')
    def read(self, *keys):
        """Who holds each of `keys` (a token, or None)."""
        return self.ops.read(*keys)

    # --- measurements and counters

    @verb('hold read')
    def holds(self):
        """{field: mean ms} of every measured hold and run time (capacity.keys.hold_field, run_field)."""
        return self.ops.holds()

    @verb('hold read')
    def hold(self, field_name):
        """One measured mean in ms (capacity.keys.run_field: a queue's run time), None when unmeasured."""
        return self.ops.hold(field_name)

    @verb('expired read')
    def expired_total(self):
        """Leases acquire found expired without a release, since the counter began."""
        return self.ops.expired_total()

    @verb('counters read')
    def counters(self):
        """{field: count} of the event counters (capacity.counters)."""
        return self.ops.counters()

    @verb('counters')
    def add_counts_later(self, take):
        """Queue one job on the Redis thread that adds what `take()` returns when it runs (`{key prefix:
        ({field: n}, {(minute, decision): n})}`) to the event counters and the decisions per minute of each
        prefix; True when queued. Never waits: a call's counters never cost it anything."""
        self.runner.thread.submit(self._add_counts, take)
        return True

    def _add_counts(self, take):
        for prefix, (counts, minutes) in take().items():
            if counts or minutes:
                self.ops.add_counts(counts, minutes, prefix)

    @verb('counters read')
    def decision_counts(self, minutes):
        """{decision: count} of each of `minutes` (whole minutes since the epoch), in order."""
        return self.ops.decision_counts(minutes)

    def probe(self):
        """PING within the deadline, whatever the skip window says: True when Redis answered (which closes
        the window), else Unknown with the error (readiness, and the next look at a Redis that failed)."""
        try:
            self.ops.ping()
        except Exception as ex:  # noqa: BLE001 - a probe's failure is its answer
            return Unknown(failopen.describe(ex))
        self.unavailable_until = 0.0
        return True


_stores = PerProcess(LaneStore)


def get_store():
    """This process's lane store (a new one in a forked child)."""
    return _stores.get()


def use_store(store):
    """Use `store` in this process from now on (tests); None makes a fresh one from settings."""
    old = _stores.peek()
    if old is not None:
        old.releases.clear()
    return _stores.set(store if store is not None else LaneStore())
