"""The service the heavy-call views call, step by step in the order a call is served (api.views.HeavyCallView):

    heavy = prepare(user, '$match', body, semantic=True, idempotency_key=key, waits=True, facts=facts)
    found = shared(heavy)            # identical work: an open one to join, or a warm result (no gate)
    call = attach(heavy, found)      # ... after the rate limit; None when it ended meanwhile
    admission = admit(heavy)         # else the gate (never raises); a refusal is a 429
    with holding(admission): ...     # the rate limit: a refusal there gives the leases back
    call = enqueue(heavy, admission) # the work, its first call and its message; or, when an identical
                                     # call claimed the work meanwhile, a call joining that one
    with waiting_slot(user, seconds) as allowed: ...  # a request that waits, if this host can hold it

Errors that drive the answer carry their data (see each class).
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
from django.db import DataError, IntegrityError
from django.utils import timezone

from capacity import counters, gate
from capacity.admission import log_record
from capacity.caller import NO_FACTS, RequestFacts, get_tier
from capacity.config import get_config
from capacity.constants import TIERS, Decision
from capacity.keeper import get_keeper
from capacity.logs import emit
from common.database import DATABASE_DOWN
from common.process import PerProcess
from workers import lanes, lifecycle, sharing
from workers.idempotency import replay
from workers.models import Call, ServedAs, State, Work

# Lower runs first on the Redis transport (steps 0, 3, 6, 9): a higher tier's calls go first in a queue.
TIER_PRIORITY = dict(zip(TIERS, (0, 3, 6, 9)))
WAIT_SLOT_SLACK_SECONDS = 5  # a waiting slot is kept this much past its wait, then expires by itself
SHARE_TRIES = 3  # identical work may end or be claimed between a look and the next step: look this often


class BrokerUnavailable(Exception):
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
                      work_key=sharing.work_key(endpoint, body, user.pk, semantic, reranker))


def shared(heavy, config=None):
    """Identical work that can serve `heavy` without admission (workers.sharing.Found), or None."""
    return sharing.find(heavy.work_key, config)


def attach(heavy, found):
    """The call of `heavy` served by `found`: joining its open work (`coalesced`), or answered by its warm
    result (`cached`); counted and recorded. When the open work ended meanwhile: its result if it
    succeeded, else None (nothing was written: the call is admitted instead). Another request with the same
    Idempotency-Key that won the race: its call."""
    work = found.work
    try:
        for _ in range(SHARE_TRIES):
            served_as = found.served_as if work.open else ServedAs.CACHED
            if served_as == ServedAs.CACHED and work.state != State.SUCCEEDED:
                return None
            admission = unadmitted(heavy, served_as)
            call = new_call(heavy, admission)
            if served_as == ServedAs.CACHED:
                call = lifecycle.serve_cached(call, work)
            else:
                call = lifecycle.join(call, work)
            if call is not None:
                counters.record_decision(admission, heavy.queue.name)
                return call
            work.refresh_from_db()  # it ended as this call joined it
    except IntegrityError:
        return idempotency_winner(heavy)
    return None


def unadmitted(heavy, served_as):
    decision = Decision.CACHED if served_as == ServedAs.CACHED else Decision.COALESCED
    return gate.unadmitted(
        heavy.user, decision, endpoint=heavy.endpoint, rows=heavy.rows, semantic=heavy.semantic,
        reranker=heavy.reranker, waits=heavy.waits, queue=heavy.queue.name, draws_on=heavy.queue.draws_on,
        facts=heavy.facts, token=heavy.call_id)


def idempotency_winner(heavy):
    winner = replay(heavy)
    if winner is None:
        raise IntegrityError(f'Heavy call {heavy.call_id} could not be written')
    return winner


def admit(heavy):
    """The gate's decision for `heavy`, counted; a refusal's log line is written here (it ends now). Its
    leases last lifecycle.queued_lease_ms: the sweep renews them while its work waits in its queue, its worker
    once it runs, so they come back within that time of whoever held them last being gone."""
    admission = gate.admit(
        heavy.user, endpoint=heavy.endpoint, rows=heavy.rows, semantic=heavy.semantic, reranker=heavy.reranker,
        waits=heavy.waits, queue=heavy.queue.name, draws_on=heavy.queue.draws_on, facts=heavy.facts,
        token=heavy.call_id, lease_ms=lifecycle.queued_lease_ms())
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
    """Record the admitted call with its work and publish it; returns its call. When an identical call
    claimed the work since `shared` looked, the leases go back and the call joins that work instead; when
    another request with this Idempotency-Key won the race, its call is returned (compare `call.pk` with
    `heavy.call_id`). A call that isn't enqueued gives its leases and its work's claim back."""
    for _ in range(SHARE_TRIES):
        if sharing.lead(heavy.work_key, heavy.call_id):
            break
        found = shared(heavy)
        call = attach(heavy, found) if found is not None else None
        if call is not None:
            gate.release(admission)
            return call
    config = get_config()
    now = timezone.now()
    work = Work(
        id=heavy.call_id, work_key=heavy.work_key, endpoint=heavy.endpoint, semantic=heavy.semantic,
        reranker=heavy.reranker, rows=heavy.rows, payload=heavy.body, queue=heavy.queue.name,
        priority=TIER_PRIORITY[admission.tier or get_tier(heavy.user)],
        lease={**admission.worker_lease_message(), 'limits': admission.worker_limits()},
        created_at=now, expires_at=now + timedelta(seconds=config.queue.deadline_seconds))
    call = new_call(heavy, admission, created_at=now)
    try:
        call = lifecycle.enqueue(work, call, publish)
    except IntegrityError:
        # Another request with the same Idempotency-Key won the race: answer with its call.
        given_back(heavy, admission)
        return idempotency_winner(heavy)
    except (DataError, *DATABASE_DOWN) as ex:
        # The rows couldn't be written (disk full, read-only; or a value the database can't store, which
        # the API answers as the request's 400): nothing was submitted, and that is what failed.
        given_back(heavy, admission, f'{type(ex).__name__}: {ex}'[:300])
        raise
    except Exception as ex:
        given_back(heavy, admission, f'{type(ex).__name__}: {ex}'[:300])
        raise BrokerUnavailable(ex) from ex
    return call


def given_back(heavy, admission, error=None):
    """A call that wasn't enqueued: its leases and its work's claim go back; a failure is logged."""
    gate.release(admission)
    sharing.abandon(heavy.work_key, heavy.call_id)
    if error is not None:
        end_in_api(admission, heavy, 'not-submitted', error)


def new_call(heavy, admission, created_at=None):
    """The call's row, not saved yet: its usage record, with its own admission."""
    return Call(id=heavy.call_id, owner=heavy.user, endpoint=heavy.endpoint, rows=heavy.rows,
                fingerprint=heavy.digest, idempotency_key=heavy.idempotency_key,
                request_id=heavy.facts.cid or '', run_id=heavy.facts.automatch_run_id or '',
                admission=admission.to_json(),
                created_at=created_at or timezone.now())


def end_in_api(admission, heavy, state, error=None):
    """The log line of a call that ends in the API (refused, or never published)."""
    record = log_record(admission)
    if record:
        emit({**record, 'queue': heavy.queue.name, 'state': state, **({'error': error} if error else {})})


@contextmanager
def waiting_slot(user, seconds, facts=NO_FACTS, endpoint='', rows=0):
    """Yield whether this request may wait `seconds` for the result of a call to `endpoint` of `rows` rows
    (a waiting POST, a long poll).

    A waiting request holds one of its API process's threads. Two bounds keep waiting from taking all of
    them, in every mode: this process's own (API_WAITING_PER_PROCESS of its API_THREADS, so /healthz and
    short requests always find a thread), and this host's api_heavy_task lane through the gate, never
    forced (`api_heavy.per_task`: what the host's processes hold together; a bulk call's request only up to
    per_task - reserve_single_row, so single-row calls' requests still wait under a bulk flood, as in the
    other lanes a single-row call takes). When either is full the request
    doesn't wait: it is answered at once (a handle, or the current state). When the limiter is off or can't
    count, the process's own bound still holds.
    """
    local = _waiting.get()
    if not local.acquire(blocking=False):
        yield False
        return
    try:
        config = get_config()
        # A slot lasts lease_seconds and this process renews it while the request waits: a process that
        # dies mid-wait gives its slots back within lease_seconds, not at the end of the longest wait.
        admission = gate.admit(user, endpoint=endpoint, rows=rows, wait_slot=True, facts=facts,
                               lease_ms=config.lease_seconds * 1000)
        lease = admission.lease()
        keeper = get_keeper()
        keeper.keep(lease, every=config.renew_seconds, until=time.time() + seconds + WAIT_SLOT_SLACK_SECONDS)
        try:
            yield not admission.refused
        finally:
            keeper.let_go(lease)
            lease.release()
    finally:
        local.release()


_waiting = PerProcess(lambda: threading.BoundedSemaphore(max(settings.API_WAITING_PER_PROCESS, 1)))
