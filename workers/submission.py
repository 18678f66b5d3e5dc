"""The service the heavy-call views call, in the order it runs: prepare, claim (and replay), submit, wait.

    heavy = prepare(user, '$match', body, semantic=True, idempotency_key=key, waits=True, facts=facts)
    with claimed(heavy) as claim:           # one request per key at a time; `claim.earlier`: the call this
        if claim.earlier is not None: ...   # key and payload made (no new lease), a racing request's included
        call, admission = submit(heavy, throttle)  # shared with identical work, or admitted and enqueued
        claim.made(call)                    # the key now names this call (None: 429, nothing was written)
    with waiting_slot(user, seconds) as allowed:  # a request that waits for the result, if this host can hold it
        ...

`submit` runs, in order: identical work (workers.sharing: a warm result, or an open leader to join, which
needs no admission), else `admit` (the gate, which never raises), the view's rate limits (`throttle`: a
refusal there gives the leases back), the work's claim, and `enqueue` (the row and its message, in one
transaction).

Errors that drive the answer carry their data (see each class). A long poll takes a waiting slot through
the same gate (`waiting_slot`).
"""
import hashlib
import json
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from capacity import counters, failopen, gate
from capacity.admission import log_record
from capacity.caller import NO_FACTS, RequestFacts, get_tier
from capacity.config import get_config
from capacity.constants import TIERS, Decision
from capacity.keys import claim_key
from capacity.logs import emit
from capacity.store import get_store
from common.database import DATABASE_DOWN
from common.process import PerProcess
from workers import lanes, lifecycle, sharing
from workers.models import HeavyCall, ServedAs

# Lower runs first on the Redis transport (steps 0, 3, 6, 9): a higher tier's calls go first in a queue.
TIER_PRIORITY = {tier: step for tier, step in zip(TIERS, (0, 3, 6, 9))}
WAIT_SLOT_SLACK_SECONDS = 5  # a long poll's slot outlives its wait by this much, then expires by itself


class SubmissionError(Exception):
    """Base of the errors a submission answers with."""


class IdempotencyConflict(SubmissionError):
    """422: this user used the key for another payload."""

    def __init__(self, key):
        super().__init__(f'Idempotency-Key "{key}" was already used with a different request.')
        self.key = key


class BrokerUnavailable(SubmissionError):
    """503: the message couldn't be published; the leases were released and nothing was recorded."""

    def __init__(self, cause):
        super().__init__('The work queue is unavailable; nothing was submitted. Please retry shortly.')
        self.cause = cause


def fingerprint(endpoint, body, semantic, reranker):
    """sha256 of the user-visible inputs: the same request gives the same fingerprint."""
    canonical = json.dumps({'endpoint': endpoint, 'semantic': bool(semantic), 'reranker': bool(reranker),
                            'body': body}, sort_keys=True, separators=(',', ':'), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Submission:
    """One heavy call as the API received it, before anything is counted."""

    user: object
    endpoint: str
    body: dict
    semantic: bool
    reranker: bool
    queue: lanes.WorkQueue
    call_id: str
    digest: str
    idempotency_key: str | None = None
    waits: bool = False
    facts: RequestFacts = NO_FACTS
    work_key: str = ''  # the key of its work (workers.sharing): identical calls share one run

    @property
    def rows(self):
        return row_count(self.body)


def row_count(payload):
    """The rows of a call's payload: a `$match` payload holds its body and its parameters."""
    body = payload.get('body', payload) if isinstance(payload, dict) else None
    return len(body.get('rows') or []) if isinstance(body, dict) else 0


def prepare(user, endpoint, body, semantic=False, reranker=False, idempotency_key=None, waits=False,
            facts=NO_FACTS):
    rows = row_count(body)
    return Submission(user=user, endpoint=endpoint, body=body, semantic=bool(semantic), reranker=bool(reranker),
                      queue=lanes.route(endpoint, rows, semantic), call_id=uuid.uuid4().hex,
                      digest=fingerprint(endpoint, body, semantic, reranker),
                      idempotency_key=idempotency_key or None, waits=waits, facts=facts,
                      work_key=sharing.work_key(endpoint, body, semantic, reranker))


def replay(heavy):
    """The earlier call this user made with the same Idempotency-Key, or None; IdempotencyConflict for
    another payload. Looked for by two columns first: most keys are new, and the whole row costs a miss
    twice the ORM's time."""
    if not heavy.idempotency_key:
        return None
    found = HeavyCall.objects.filter(owner=heavy.user, idempotency_key=heavy.idempotency_key).values_list(
        'pk', 'fingerprint')[:1]
    if not found:
        return None
    pk, digest = found[0]
    if digest != heavy.digest:
        raise IdempotencyConflict(heavy.idempotency_key)
    return HeavyCall.objects.filter(pk=pk).first()


CLAIM_SECONDS = 10      # a claim outlives a stuck request by at most this much
CLAIM_WAIT_SECONDS = 5  # how long a racing request waits for the claimant's call
KNOWN_SECONDS = 24 * 3600  # how long a key stays claimed after its call was recorded (at most retention)


class Claim:
    """One request's hold on its Idempotency-Key (see `claimed`): `earlier` is the call to answer with (made
    before with this key and payload, or by a racing request); `made(call)` tells it what `submit` gave the
    request: a call recorded with the key (its own, or the one that won a race for the key), which keeps
    the key claimed, or None (refused: nothing was written)."""

    def __init__(self):
        self.earlier = None
        self.recorded = False

    def made(self, call):
        self.recorded = call is not None


def known_seconds():
    """How long a recorded call's key stays claimed: a day, never past the call's row (retention deletes
    it that long after the call ended, so after the claim expired)."""
    return max(1, min(KNOWN_SECONDS, settings.HEAVY_LANES_RETENTION_SECONDS))


@contextmanager
def claimed(heavy):
    """Hold this user's Idempotency-Key while the call is admitted and recorded; yield its Claim.

    Two racing requests with one key used to both pass the gate and the rate limit before the row's
    unique constraint picked one: the loser took a gate decision and rate-limit allowance for nothing. The
    first claims the key in Redis (SET NX); a second waits up to CLAIM_WAIT_SECONDS for the first one's
    row and is answered with it (`replay`), or claims the key itself when the first gave up without a
    call (refused, 503). Without Redis the constraint alone still gives both one call.

    A request that recorded a call under the key keeps it claimed for `known_seconds()`, so a resend finds
    the claim and is answered with that call (`replay`), while a claim that SET NX takes at once is a new
    key, answered with no database lookup. Should Redis have lost the claim of a recorded call (a flush, a
    failover, a restart), a resend is still answered with that call, by the row's unique constraint, at the
    price of an admission and a rate-limit allowance.
    """
    claim = Claim()
    if not heavy.idempotency_key:
        yield claim
        return
    store = get_store()
    key = claim_key('idempotency', heavy.user.pk, hashlib.sha256(heavy.idempotency_key.encode()).hexdigest())
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    held = False
    try:
        while True:
            if store.is_available():
                try:
                    held = bool(store.command('set', key, heavy.call_id, nx=True, ex=CLAIM_SECONDS))
                except Exception as ex:  # noqa: BLE001 - fail open: the unique constraint decides
                    failopen.record(None, ex, 'idempotency claim', store)
                    held = None
            else:
                held = None
            if held:
                yield claim  # a new key: no call was recorded with it (see above)
                return
            if held is None:
                # Without Redis: a resend still gets its call at once.
                claim.earlier = replay(heavy)
                yield claim
                return
            claim.earlier = replay(heavy)
            if claim.earlier is not None or time.monotonic() >= deadline:
                yield claim
                return
            time.sleep(0.02)
    finally:
        if held:
            try:
                if claim.recorded:
                    store.command('expire', key, known_seconds())
                else:
                    store.command('delete', key)
            except Exception as ex:  # noqa: BLE001 - it expires in CLAIM_SECONDS
                failopen.record(None, ex, 'idempotency claim release', store)


SHARE_TRIES = 3  # an identical call may take the work between our look and our claim; look again this often


def submit(heavy, throttle):
    """Serve `heavy`; return (call, admission), call None when admission refused it (its log line is
    written; nothing was taken or written).

    Identical work serves it when there is some: a warm result or an open leader, with no admission, no
    lease and no message. Else it is admitted, claims the work (so identical calls join it) and is
    enqueued. `throttle()` is the view's rate limit: it raises to refuse, and runs once, after the gate
    and before anything is written.
    """
    throttled = False
    for attempt in range(SHARE_TRIES + 1):
        config = get_config()
        found = sharing.find(heavy.work_key, config) if attempt < SHARE_TRIES else None
        if found is not None:
            if not throttled:
                throttle()
                throttled = True
            admission = unadmitted(heavy, found.served_as, config)
            try:
                call = sharing.attach(new_row(heavy, admission, config), found)
            except IntegrityError:
                return idempotency_winner(heavy), None
            if call is not None:
                counters.record_decision(admission, heavy.queue.name)
                return call, admission
            continue  # the work was cancelled as this call joined it: look again
        admission = admit(heavy)
        if admission.refused:
            return None, admission
        if not throttled:
            with holding(admission):
                throttle()
            throttled = True
        if attempt == SHARE_TRIES or sharing.lead(heavy.work_key, heavy.call_id, config):
            call = enqueue(heavy, admission)
            if call.pk != heavy.call_id:  # another request with this Idempotency-Key won the race
                return call, None
            return call, admission
        gate.release(admission)  # an identical call took the work meanwhile: share it
    raise AssertionError('unreachable')  # the last attempt enqueues


def unadmitted(heavy, served_as, config):
    decision = Decision.CACHED if served_as == ServedAs.CACHED else Decision.COALESCED
    return gate.unadmitted(
        heavy.user, decision, endpoint=heavy.endpoint, rows=heavy.rows, semantic=heavy.semantic,
        reranker=heavy.reranker, waits=heavy.waits, queue=heavy.queue.name, draws_on=heavy.queue.draws_on,
        facts=heavy.facts, token=heavy.call_id, config=config)


def idempotency_winner(heavy):
    winner = replay(heavy)
    if winner is None:
        raise IntegrityError(f'Heavy call {heavy.call_id} could not be written')
    return winner


def admit(heavy):
    """The gate's decision for `heavy`, counted; a refusal's log line is written here (it ends now)."""
    admission = gate.admit(
        heavy.user, endpoint=heavy.endpoint, rows=heavy.rows, semantic=heavy.semantic, reranker=heavy.reranker,
        waits=heavy.waits, queue=heavy.queue.name, draws_on=heavy.queue.draws_on, facts=heavy.facts,
        token=heavy.call_id)
    counters.record_decision(admission, heavy.queue.name)
    if admission.refused:
        end_in_api(admission, heavy, 'refused')
    return admission


@contextmanager
def holding(admission):
    """Give the leases back if the block raises (the view's rate limit refused the call)."""
    try:
        yield admission
    except BaseException:
        gate.release(admission)
        raise


def enqueue(heavy, admission, publish=None):
    """Record the call and publish it; returns the call (another request's, when it won an
    Idempotency-Key race: compare `call.pk` with `heavy.call_id`). A call that isn't enqueued gives its
    leases and its work's claim back."""
    call = new_row(heavy, admission)
    try:
        call = lifecycle.enqueue(call, publish)
    except IntegrityError:
        # Another request with the same Idempotency-Key won the race: answer with its call.
        gate.release(admission)
        sharing.abandon(heavy.work_key, heavy.call_id)
        winner = replay(heavy)
        if winner is None:
            raise
        return winner
    except DATABASE_DOWN as ex:
        # The row couldn't be written (disk full, read-only): nothing was submitted, and that is what failed.
        gate.release(admission)
        sharing.abandon(heavy.work_key, heavy.call_id)
        end_in_api(admission, heavy, 'not-submitted', f'{type(ex).__name__}: {ex}'[:300])
        raise
    except Exception as ex:
        gate.release(admission)
        sharing.abandon(heavy.work_key, heavy.call_id)
        end_in_api(admission, heavy, 'not-submitted', f'{type(ex).__name__}: {ex}'[:300])
        raise BrokerUnavailable(ex) from ex
    counters.record_served(call.queue, ServedAs.RUN)
    return call


def new_row(heavy, admission, config=None):
    """The call's row, not saved yet: its usage record, with its admission (the leases it holds)."""
    config = config or get_config()
    now = timezone.now()
    return HeavyCall(
        id=heavy.call_id, owner=heavy.user, endpoint=heavy.endpoint, queue=heavy.queue.name,
        semantic=heavy.semantic, reranker=heavy.reranker, rows=heavy.rows,
        priority=TIER_PRIORITY[admission.tier or get_tier(heavy.user)], payload=heavy.body,
        fingerprint=heavy.digest, work_key=heavy.work_key, idempotency_key=heavy.idempotency_key,
        admission=admission.to_json(), request_id=heavy.facts.cid or '',
        created_at=now, expires_at=now + timedelta(seconds=config.queue.deadline_seconds))


def end_in_api(admission, heavy, state, error=None):
    """The log line of a call that ends in the API (refused, or never published)."""
    record = log_record(admission)
    if record:
        emit({**record, 'queue': heavy.queue.name, 'state': state, **({'error': error} if error else {})})


@contextmanager
def waiting_slot(user, seconds, facts=NO_FACTS):
    """Yield whether this request may wait `seconds` for a call's result (a waiting POST, a long poll).

    A waiting request holds one of its API process's threads. Two bounds keep waiting from taking all of
    them, in every mode: this process's own (API_WAITING_PER_PROCESS of its API_THREADS, so /healthz and
    short requests always find a thread), and this host's api_heavy_task lane through the gate, never
    forced (`api_heavy.per_task`: what the host's processes hold together). When either is full the request
    doesn't wait: it is answered at once (a handle, or the current state). When the limiter is off or can't
    count, the process's own bound still holds.
    """
    local = _waiting.get()
    if not local.acquire(blocking=False):
        yield False
        return
    try:
        admission = gate.admit(user, wait_slot=True, facts=facts,
                               lease_ms=(seconds + WAIT_SLOT_SLACK_SECONDS) * 1000)
        try:
            yield not admission.refused
        finally:
            gate.release(admission)
    finally:
        local.release()


_waiting = PerProcess(lambda: threading.BoundedSemaphore(max(settings.API_WAITING_PER_PROCESS, 1)))
