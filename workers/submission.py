"""The one service API views call for a heavy call: gate, then enqueue, then answer.

    outcome = submit(request, endpoint='$match', body=cleaned, semantic=True, reranker=False,
                     idempotency_key=key, wait_seconds=0)

returns an Outcome: `refused` (429: the gate said no), `call` (the HeavyCall, new or an idempotent replay),
and `gate` (for headers). Errors that drive the answer carry their data:
- IdempotencyConflict (422): the key was used by this user for another payload;
- BrokerUnavailable (503): the message couldn't be published; the leases were released and nothing was
  recorded.
A new call's row (also its usage record) is created in the same transaction that publishes its message: no
row without a message.
"""
import hashlib
import json
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from capacity import counters, failopen
from capacity.caller import get_tier
from capacity.config import get_config
from capacity.constants import TIERS, Lane
from capacity.gate import CapacityGate
from capacity.keys import lane_key
from capacity.lease import Lease
from capacity.logs import emit
from capacity.store import RedisLanes
from workers import execution, notify
from workers.lanes import route
from workers.models import FINAL_STATES, OPEN_STATES, HeavyCall, State

# Lower runs first on the Redis transport (steps 0, 3, 6, 9): a higher tier's calls go first in a queue.
TIER_PRIORITY = {tier: step for tier, step in zip(TIERS, (0, 3, 6, 9))}


class SubmissionError(Exception):
    """Base of the errors a submission answers with (see the module docstring)."""


class IdempotencyConflict(SubmissionError):
    def __init__(self, key):
        super().__init__(f'Idempotency-Key "{key}" was already used with a different request.')
        self.key = key


class BrokerUnavailable(SubmissionError):
    def __init__(self, cause):
        super().__init__('The work queue is unavailable; nothing was submitted. Please retry shortly.')
        self.cause = cause


@dataclass(frozen=True)
class Outcome:
    gate: CapacityGate | None
    call: HeavyCall | None = None
    replayed: bool = False

    @property
    def refused(self):
        return self.gate is not None and self.gate.refused


def fingerprint(endpoint, body, semantic, reranker):
    """sha256 of the user-visible inputs: the same request gives the same fingerprint."""
    canonical = json.dumps({'endpoint': endpoint, 'semantic': bool(semantic), 'reranker': bool(reranker),
                            'body': body}, sort_keys=True, separators=(',', ':'), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def replay(user, key, digest):
    """The earlier call this user made with `key`, or None; IdempotencyConflict for another payload."""
    if not key:
        return None
    call = HeavyCall.objects.filter(owner=user, idempotency_key=key).first()
    if call is not None and call.fingerprint != digest:
        raise IdempotencyConflict(key)
    return call


def submit(request, endpoint, body, semantic=False, reranker=False, idempotency_key=None, wait_seconds=0,
           admit=None, publish=None):
    """Gate, then `admit()` (the view's rate limits: may raise), meter and enqueue; see the module doc."""
    user = request.user
    rows = len(body.get('rows') or [])
    digest = fingerprint(endpoint, body, semantic, reranker)
    earlier = replay(user, idempotency_key, digest)
    if earlier is not None:
        return Outcome(gate=None, call=earlier, replayed=True)

    queue = route(endpoint, rows, semantic).name
    call_id = uuid.uuid4().hex
    gate = CapacityGate.for_request(request, endpoint=endpoint, rows=rows, semantic=semantic, reranker=reranker,
                                    waits=wait_seconds > 0, queue=queue, token=call_id).acquire()
    counters.record_decision(gate, queue)
    if gate.refused:
        record = gate.record()
        if record:
            emit({**record, 'queue': queue, 'state': 'refused'})
        return Outcome(gate=gate)
    if admit is not None:
        try:
            admit()
        except Exception:
            gate.release()
            raise

    config = gate.config or get_config()
    tier = gate.tier or get_tier(user)
    now = timezone.now()
    expires_at = now + timedelta(seconds=config['queue']['deadline_seconds'])
    call = HeavyCall(
        id=call_id, owner=user, endpoint=endpoint, lane=queue, semantic=bool(semantic), reranker=bool(reranker),
        rows=rows, priority=TIER_PRIORITY[tier], payload=body, fingerprint=digest,
        idempotency_key=idempotency_key or None, admission=admission(gate), created_at=now, expires_at=expires_at)
    try:
        with transaction.atomic():
            call.save(force_insert=True)  # the row is also the call's usage record
            (publish or send)(call)
    except IntegrityError:
        # Another request with the same Idempotency-Key won the race: answer with its call.
        gate.release()
        winner = replay(user, idempotency_key, digest)
        if winner is None:
            raise
        return Outcome(gate=None, call=winner, replayed=True)
    except Exception as ex:
        gate.release()
        record = gate.record()
        if record:
            emit({**record, 'queue': queue, 'state': 'not-submitted', 'error': f'{type(ex).__name__}: {ex}'[:300]})
        raise BrokerUnavailable(ex) from ex
    return Outcome(gate=gate, call=call)


def admission(gate):
    """What the worker needs from admission: the lanes to renew and release, and the log record."""
    task_key = gate.task_key
    lanes = [(key, item.limit) for key, item in zip(gate.keys, gate.lanes) if key != task_key]
    return {
        'decision': str(gate.decision) if gate.decision else None,
        'holding': gate.holding,
        'keys': [key for key, _ in lanes],
        'limits': [limit for _, limit in lanes],
        'record': gate.record(),
    }


def send(call):
    """Publish the call's message on its lane's queue, expiring at its queue deadline."""
    from workers.tasks import run_heavy_call
    run_heavy_call.apply_async(args=[call.pk], task_id=call.pk, queue=call.lane, expires=call.expires_at,
                               priority=call.priority)


def wait(call, seconds, gate=None):
    """Wait up to `seconds` for `call` to finish, then stop holding this API host's lane."""
    try:
        def finished():
            call.refresh_from_db(fields=['state', 'started_at', 'finished_at', 'error'])
            return call.state in FINAL_STATES
        return notify.wait_for(call.pk, finished, seconds)
    finally:
        if gate is not None:
            gate.release_task_lane()


@contextmanager
def api_worker_slot(seconds):
    """Yield whether this request may hold its API worker for `seconds` (a long poll).

    A request that waits holds one of the host's few sync workers, so it takes a lease in this host's
    api_heavy_task lane like a heavy call that waits (limit api_heavy.per_task). When the lane is full it
    answers at once instead of waiting; when the lanes can't be counted it waits (fail open).
    """
    config = get_config()
    key = lane_key(Lane.API_HEAVY_TASK, settings.CAPACITY_TASK_ID)
    token = f'poll-{uuid.uuid4().hex}'
    taken = True
    if config['mode'] != 'off' and RedisLanes.is_available():
        try:
            taken = RedisLanes.acquire([key], [config['api_heavy']['per_task']], token,
                                       (seconds + 5) * 1000, force=False).taken
        except Exception as ex:  # noqa: BLE001 - fail open: wait uncounted
            failopen.record(None, ex, 'long-poll slot')
            taken = True
    try:
        yield taken
    finally:
        if taken:
            Lease([key], token, 0).release()


def cancel(call):
    """Cancel a queued or running call: mark it, release its leases, and stop it where it runs.

    The row is marked first, so a worker that receives the call later skips it even if the revoke
    broadcast (which only reaches workers alive now) is lost. Returns False when it had already ended.
    """
    was = call.state
    cancelled = HeavyCall.objects.filter(pk=call.pk, state__in=OPEN_STATES).update(
        state=State.CANCELLED, finished_at=timezone.now())
    call.refresh_from_db()
    if not cancelled:
        return False
    lease = Lease((call.admission or {}).get('keys', []), call.pk, 0,
                  holding=(call.admission or {}).get('holding', False))
    lease.release()
    execution.log_line(call, lease)
    notify.publish(call.pk, call.state)
    try:
        from workers.celery import app
        app.control.revoke(call.pk, terminate=(was == State.RUNNING), signal='SIGTERM')
    except Exception:  # noqa: BLE001 - the row already says cancelled; a worker checks it before running
        pass
    return True


def result_of(call):
    """The stored result of a finished call (the Celery result backend holds it, by task id)."""
    from django_celery_results.models import TaskResult
    row = TaskResult.objects.filter(task_id=call.pk).values_list('result', flat=True).first()
    return json.loads(row) if row else None


def position(call):
    """1-based place of a queued call among the queued calls of its lane (priority, then age)."""
    if call.state != State.QUEUED:
        return None
    from django.db.models import Q
    ahead = HeavyCall.objects.filter(lane=call.lane, state=State.QUEUED).filter(
        Q(priority__lt=call.priority) | Q(priority=call.priority, created_at__lt=call.created_at)).count()
    return ahead + 1


def expire_if_overdue(call):
    """A queued call past its deadline is expired, even before a worker sees its message."""
    if call.state == State.QUEUED and timezone.now() >= call.expires_at:
        execution.end_unstarted(call.pk, State.EXPIRED)
        call.refresh_from_db()
    return call

