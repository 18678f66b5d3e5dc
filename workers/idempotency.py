"""Idempotency-Key: the same key and payload from one user return the same call, taking nothing new.

    with claimed(heavy) as claim:          # one request per key at a time
        if claim.earlier is not None: ...  # the call this key and payload made (a racing request's included)
        ...                                # else serve the call (workers.submission)
        claim.made(call)                   # the key now names this call (None: refused, nothing written)

Two racing requests with one key used to both pass the gate and the rate limit before the call's unique
constraint picked one: the loser took a gate decision and rate-limit allowance for nothing. The first claims
the key in Redis (the lane store's `claim`); a second waits up to CLAIM_WAIT_SECONDS for the first one's
call and is answered with it (`replay`), or claims the key itself when the first gave up without a call
(refused, 503). Without Redis the constraint alone still gives both one call.

A request that recorded a call under the key keeps it claimed for `known_seconds()` (the claim then holds
`KEPT`, not the request's token: nothing reads it), so a resend finds the claim and is answered with that
call, while a claim taken at once is a new key, answered with no database lookup. Should Redis have lost
the claim of a recorded call (a flush, a failover), a resend is still answered with that call, by the
unique constraint, at the price of an admission and a rate-limit allowance.
"""
import hashlib
import time
from contextlib import contextmanager

from django.conf import settings

from capacity.keys import claim_key
from capacity.store import Unknown, get_store
from workers.models import Call

CLAIM_SECONDS = 10      # a claim outlives a stuck request by at most this much
CLAIM_WAIT_SECONDS = 5  # how long a racing request waits for the claimant's call
KNOWN_SECONDS = 24 * 3600  # how long a key stays claimed after its call was recorded (at most retention)
MAX_KEY_CHARS = 255  # Call.idempotency_key
RETRY_PREFIX = 'retry:'


def retry_key(call_id, key):
    """The key a retry of call `call_id` (POST /tasks/<id>/retry/) is recorded under when it was sent with
    Idempotency-Key `key`: that key in the retried call's own scope, `retry:<call id>:<key>` (the key's
    sha256 when that would be longer than a key may be). So a retry sent with the key its original call
    was sent with is a new call, not that call again, while the same retry sent twice is one call. None
    without a key."""
    if key is None:
        return None
    scoped = f'{RETRY_PREFIX}{call_id}:{key}'
    if len(scoped) > MAX_KEY_CHARS:
        scoped = f'{RETRY_PREFIX}{call_id}:sha256:{hashlib.sha256(key.encode()).hexdigest()}'
    return scoped
# A kept claim is one Redis key a call for a day (~8.6 GB at 500 calls/s with a 64-character digest and the
# call's id as its value, 200 B each): 128 bits of the digest name a key of one user well enough, and a
# kept claim holds one character. 120 B (docs/deployment.md, "Scaling on paper").
DIGEST_CHARS = 32
KEPT = '1'


class IdempotencyConflict(Exception):
    """422: this user used the key for another payload."""

    def __init__(self, key):
        super().__init__(f'Idempotency-Key "{key}" was already used with a different request.')
        self.key = key


def replay(heavy):
    """The earlier call this user made with the same Idempotency-Key, or None; IdempotencyConflict for
    another payload. Looked for by two columns first: most keys are new, and the whole row costs a miss
    twice the ORM's time."""
    if not heavy.idempotency_key:
        return None
    found = Call.objects.filter(owner=heavy.user, idempotency_key=heavy.idempotency_key).values_list(
        'pk', 'fingerprint')[:1]
    if not found:
        return None
    pk, digest = found[0]
    if digest != heavy.digest:
        raise IdempotencyConflict(heavy.idempotency_key)
    return Call.objects.select_related('work').filter(pk=pk).first()


class Claim:
    """One request's hold on its Idempotency-Key: `earlier` is the call to answer with (made before with
    this key and payload, or by a racing request); `made(call)` tells it what the request made: a call
    recorded with the key (its own, or the one that won a race for the key), which keeps the key claimed,
    or None (refused: nothing was written)."""

    def __init__(self):
        self.earlier = None
        self.recorded = False

    def made(self, call):
        self.recorded = call is not None


def known_seconds():
    """How long a recorded call's key stays claimed: a day, never past the call's row (retention deletes
    it that long after the call ended, so after the claim expired)."""
    return max(1, min(KNOWN_SECONDS, settings.HEAVY_LANES_RETENTION_SECONDS))


def key_claim(user_id, idempotency_key):
    """The Redis key of the claim of `user_id`'s `idempotency_key`."""
    return claim_key('idempotency', user_id, hashlib.sha256(idempotency_key.encode()).hexdigest()[:DIGEST_CHARS])


@contextmanager
def claimed(heavy):
    """Hold this user's Idempotency-Key while the call is admitted and recorded; yield its Claim (see the
    module docstring)."""
    claim = Claim()
    if not heavy.idempotency_key:
        yield claim
        return
    store = get_store()
    key = key_claim(heavy.user.pk, heavy.idempotency_key)
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    held = False
    try:
        while True:
            held = store.claim(key, heavy.call_id, CLAIM_SECONDS * 1000)
            if held is True:
                yield claim  # a new key: no call was recorded with it
                return
            claim.earlier = replay(heavy)
            if isinstance(held, Unknown) or claim.earlier is not None or time.monotonic() >= deadline:
                yield claim  # without Redis a resend still gets its call at once; the constraint decides races
                return
            time.sleep(0.02)
    finally:
        if held is True:
            if claim.recorded:
                store.keep(key, known_seconds(), KEPT)  # nobody reads the token of a kept claim
            else:
                store.unclaim(key, heavy.call_id)
