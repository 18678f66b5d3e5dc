"""One heavy call's lifecycle: every state change is one function here, each a guarded UPDATE.

    queued ──start──▶ running ──succeed──▶ succeeded
      │                  ├──────fail─────▶ failed
      ├──cancel──▶ cancelled ◀──cancel──┘
      └──expire──▶ expired                 (not started before its queue deadline)

- `enqueue(call)` writes the row and publishes its message in one transaction: no row without a message.
- `start(call, worker)` claims a queued call for a worker, or takes over a running one whose worker is
  gone (a redelivery); a message of a call that runs on a live worker gets `BUSY` and must not run now: it
  is looked at again once that worker's heartbeat would be stale (it is a duplicate if the call ends
  first, a redelivery from a dead worker if it doesn't). A call runs at most once at a time.
- `beat(call, worker)` is the running worker's heartbeat; False means the call is no longer its own
  (cancelled, or taken over), and the work must stop.
- `succeed` stores the result (django-celery-results' TaskResult, by task id) and the state in one
  transaction, so a poll that sees `succeeded` finds the result and a cancelled call never gets one;
  `fail` records the error and gives the usage back (the row is the usage record); `ended` writes the
  log line and the completion notice once the worker has released the leases.
- `cancel` ends a queued call at once (its leases go back now) or a running one (its worker stops it and
  releases its leases once it has stopped); `expire` and `end_unstarted` end a call that will never run;
  `time_out` ends a call whose process was killed at its hard time limit.
- For the sweep (workers.sweep): `overdue` and `maybe_lost` find the calls nothing else would end or run,
  `redeliver` publishes again the message of one that lost it; for retention (workers.retention),
  `forget_finished` deletes old calls with their results. Every end is counted once (capacity.counters).

The read side is here too: `position`, `result`, `wait`, `log_line`. Workers and views call these and
never write a call's state themselves; this is the only module that reads the stored results.
"""
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta

from celery import states
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from capacity import counters
from capacity.admission import Admission, log_record
from capacity.config import get_config, time_limits
from capacity.logs import emit
from workers import messages, notify, publisher
from workers.celery import TASK_NAME, app
from workers.models import FINAL_STATES, OPEN_STATES, HeavyCall, State

logger = logging.getLogger('heavy_lanes')
ERROR_LENGTH = 2000
ROW_WAIT_SECONDS = 5.0
CANCELLED = 'The call was cancelled.'
EXPIRED = 'The call waited in its queue past its deadline and was not run.'
FAILED = 'The call failed.'
SOFT_LIMIT = 'The call was stopped by its time limit ({seconds} s, max_hold_seconds) and did not finish.'
HARD_LIMIT = ('The call was stopped by its hard time limit ({seconds} s): its worker process did not end it '
              'at the soft limit and was killed.')


# --- create and publish -------------------------------------------------------------------------------------

def send(call):
    """Publish the call's message on its queue, expiring at its queue deadline, with the time limits of the
    config in force, within the publish deadline (workers.publisher). By task name: the API never imports
    the tasks module, and so none of the workers' signal handlers."""
    limits = time_limits(get_config())
    publisher.publish(app.send_task, TASK_NAME, args=[call.pk], task_id=call.pk, queue=call.queue,
                      expires=call.expires_at, priority=call.priority, soft_time_limit=limits.soft,
                      time_limit=limits.hard, headers={'request_id': call.request_id or None})


def enqueue(call, publish=None):
    """Insert `call` (a new, unsaved HeavyCall) and publish its message, in one transaction.

    A publish that fails rolls the row back and raises; an IntegrityError means another request with the
    same Idempotency-Key won the race (the caller answers with that call).
    """
    with transaction.atomic():
        call.save(force_insert=True)  # the row is also the call's usage record
        (publish or send)(call)
    return call


# --- the worker's side --------------------------------------------------------------------------------------

def load(call_id, wait=None):
    """The call's row, waiting up to ROW_WAIT_SECONDS for the API's commit; None if it never comes."""
    deadline = time.monotonic() + (ROW_WAIT_SECONDS if wait is None else wait)
    pause = 0.002  # the commit is usually a millisecond or two behind the message: look again soon
    while True:
        call = HeavyCall.objects.filter(pk=call_id).first()
        if call is not None or time.monotonic() >= deadline:
            return call
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


@dataclass(frozen=True)
class Start:
    """What `start` decided for one delivery of a call's message."""

    kind: str          # RUN, EXPIRE, ENDED or BUSY
    redelivered: bool = False
    retry_in: float = 0.0  # BUSY: seconds until the running worker's heartbeat would be stale


RUN, EXPIRE, ENDED, BUSY = 'run', 'expire', 'ended', 'busy'


def worker_name(node):
    return f'{node} pid {os.getpid()}'


def holder_gone(call, me, now, stale_seconds):
    """Whether the worker that last marked `call` running is gone (so this delivery may take over).

    Gone: it never beat, or its heartbeat is older than `stale_seconds`, or it ran on this node in a
    process that no longer exists (a pool process killed: the broker redelivers at once).
    """
    if not call.worker or call.heartbeat_at is None or call.heartbeat_at < now - timedelta(seconds=stale_seconds):
        return True
    node, _, pid = call.worker.rpartition(' pid ')
    my_node = me.rpartition(' pid ')[0]
    if node != my_node or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True  # this process runs one call at a time: its earlier run of it is over
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def start(call, worker):
    """Claim `call` for `worker` ('<node> pid <pid>'); see Start. Updates `call` to what was written."""
    now = timezone.now()
    if call.state == State.QUEUED and now >= call.expires_at:
        return Start(EXPIRE)
    if call.state not in OPEN_STATES:
        return Start(ENDED)
    redelivered = call.attempts > 0
    claim = HeavyCall.objects.filter(pk=call.pk)
    if call.state == State.QUEUED:
        claim = claim.filter(state=State.QUEUED)
    elif holder_gone(call, worker, now, stale_seconds := get_config()['lease_seconds']):
        # Compare and set: of two deliveries taking over at once, one wins.
        claim = claim.filter(state=State.RUNNING, worker=call.worker, heartbeat_at=call.heartbeat_at)
    else:
        return Start(BUSY, redelivered, retry_in=busy_retry_in(call, now, stale_seconds))
    if not claim.update(state=State.RUNNING, started_at=now, attempts=F('attempts') + 1, worker=worker,
                        heartbeat_at=now):
        fresh = HeavyCall.objects.filter(pk=call.pk).values_list('state', flat=True).first()
        if fresh == State.RUNNING:
            return Start(BUSY, redelivered, retry_in=get_config()['lease_seconds'])
        return Start(ENDED, redelivered)
    call.state, call.started_at, call.attempts = State.RUNNING, now, call.attempts + 1
    call.worker, call.heartbeat_at = worker, now
    return Start(RUN, redelivered)


def busy_retry_in(call, now, stale_seconds):
    """When to look again at a call another worker runs: just after its heartbeat would go stale."""
    age = (now - call.heartbeat_at).total_seconds() if call.heartbeat_at else stale_seconds
    return max(1.0, stale_seconds - age + 1.0)


def beat(call, worker):
    """The running worker is alive; False when the call is no longer its own (cancelled or taken over)."""
    now = timezone.now()
    return bool(HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING, worker=worker).update(heartbeat_at=now))


def note_limiter(call, lease):
    """Keep what the limiter met while the call ran (a lost lease, an error) for its log line."""
    if lease.lease_lost or lease.error:
        call.lease_lost, call.limiter_error = lease.lease_lost, (lease.error or '')[:300]
        HeavyCall.objects.filter(pk=call.pk).update(lease_lost=call.lease_lost, limiter_error=call.limiter_error)


def succeed(call, result, worker=None):
    """Record that a running call succeeded with `result`: the result and the state in one transaction.

    False (and nothing stored) when the call is no longer running on `worker` (cancelled meanwhile). The
    caller releases the leases, then calls `ended`.
    """
    finished_at = timezone.now()
    running = HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING)
    if worker is not None:
        running = running.filter(worker=worker)
    with transaction.atomic():
        if not running.update(state=State.SUCCEEDED, finished_at=finished_at, error=''):
            return False
        app.backend.store_result(call.pk, result, states.SUCCESS)
    call.state, call.finished_at, call.error = State.SUCCEEDED, finished_at, ''
    return True


@dataclass(frozen=True)
class Failure:
    """Why a call failed: the message a poll shows, and what the in-request endpoint would have answered."""

    message: str
    status: int = 500
    body: dict | None = None

    @classmethod
    def internal(cls, message):
        return cls(message, 500, {'detail': f'The call failed: {message}'[:ERROR_LENGTH], 'error_code': 'call_failed'})

    @classmethod
    def invalid(cls, detail):
        """A bad body found by the worker (the view's checks passed, the source went away...): a 400."""
        detail = json.loads(json.dumps(detail, default=str))  # DRF's ErrorDetail strings as plain JSON
        return cls(f'Invalid request: {json.dumps(detail)}', 400, {'detail': detail, 'error_code': 'invalid'})

    @classmethod
    def time_limit(cls, message):
        return cls(message, 504, {'detail': message, 'error_code': 'time_limit'})


def fail(call, failure, worker=None):
    """Record that a running call failed (a Failure, or a message) and give its usage back; False when it
    is no longer running on `worker`. The caller releases the leases, then calls `ended`."""
    if not isinstance(failure, Failure):
        failure = Failure.internal(str(failure))
    finished_at = timezone.now()
    error = failure.message[:ERROR_LENGTH]
    running = HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING)
    if worker is not None:
        running = running.filter(worker=worker)
    if not running.update(state=State.FAILED, finished_at=finished_at, error=error, refunded_at=finished_at,
                          error_status=failure.status, error_body=failure.body):
        return False
    call.state, call.finished_at, call.error, call.refunded_at = State.FAILED, finished_at, error, finished_at
    call.error_status, call.error_body = failure.status, failure.body
    return True


def time_out(call_id, seconds, node):
    """A call whose pool process its worker killed at the hard time limit (`seconds`): end it `failed`
    with that reason and release its leases (from the worker's main process, where Celery enforces the
    limit). Only a run on `node` is ended: a later delivery elsewhere owns the call. Idempotent."""
    call = HeavyCall.objects.filter(pk=call_id).first()
    if call is None or call.state != State.RUNNING or not call.worker.startswith(f'{node} pid '):
        return False
    if not fail(call, Failure.time_limit(HARD_LIMIT.format(seconds=seconds)), worker=call.worker):
        return False
    lease = admission_of(call).lease()
    lease.release()
    note_limiter(call, lease)
    ended(call, lease)
    return True


def stored_result(call_id):
    """The JSON text of a stored successful result, or None."""
    from django_celery_results.models import TaskResult
    return TaskResult.objects.filter(task_id=call_id, status=states.SUCCESS).values_list(
        'result', flat=True).first()


# --- ending a call that won't run, or won't run on --------------------------------------------------------

def cancel(call):
    """Cancel a queued or running call; return the state it was cancelled from, or None if it had ended.

    A queued call is cancelled at once: a worker's `start` then finds it cancelled and never runs it, so its
    leases are released here. A running call is stopped where it runs (Celery's revoke with terminate, and
    its worker's heartbeat as the backstop); its leases are released by that worker once it has stopped.
    """
    now = timezone.now()
    if HeavyCall.objects.filter(pk=call.pk, state=State.QUEUED).update(state=State.CANCELLED, finished_at=now):
        was = State.QUEUED
    elif HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING).update(state=State.CANCELLED, finished_at=now):
        was = State.RUNNING
    else:
        call.refresh_from_db()
        return None
    call.refresh_from_db()
    counters.record_end(call.queue, State.CANCELLED)  # counted at the transition (its worker may be gone)
    if was == State.QUEUED:
        lease = admission_of(call).lease()
        lease.release()
        ended(call, lease, count=False)
        discard_message(call)
    try:
        app.control.revoke(call.pk, terminate=(was == State.RUNNING), signal='SIGTERM')
    except Exception:  # noqa: BLE001 - the row says cancelled; a worker checks it before and while running
        logger.warning('Revoke of cancelled call %s not sent; its worker finds the row cancelled', call.pk)
    return was


def taken_over(call, worker):
    """Whether another delivery runs `call` now (this worker was presumed gone): it holds the leases."""
    return HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING).exclude(worker=worker).exists()


def stopped(call_id, lease=None):
    """A cancelled call's work has stopped (its process was terminated, or its worker stopped it): release
    its leases (`lease`, the worker's, or the admission's), mark that no worker runs it, and log it."""
    call = HeavyCall.objects.filter(pk=call_id).first()
    if call is None or call.state != State.CANCELLED:
        return False
    lease = lease or admission_of(call).lease()
    lease.release()
    HeavyCall.objects.filter(pk=call_id, state=State.CANCELLED).update(heartbeat_at=None)
    call.heartbeat_at = None
    ended(call, lease, count=False)  # counted when it was cancelled
    return True


def wait_stopped(call, seconds):
    """Wait up to `seconds` until no worker runs `call` any more (it ended, or it was cancelled and its work
    has stopped); True when that happened."""
    def stopped_now():
        call.refresh_from_db(fields=['state', 'heartbeat_at', 'finished_at'])
        return call.state in FINAL_STATES and (call.state != State.CANCELLED or call.heartbeat_at is None)
    return notify.wait_for(call.pk, stopped_now, seconds)


def end_unstarted(call_id, state, purge=False):
    """End a call that won't run (`expired` past its deadline, `cancelled` when revoked before it ran):
    mark it if it is still open, release its leases, log it. Idempotent. A call that runs (a message of
    it expired or was revoked while another delivery runs it) is left alone, leases and all. `purge`: its
    message may still wait on the broker (no worker took it): take it out, so the queue's depth counts only
    calls that still wait."""
    now = timezone.now()
    open_states = [State.QUEUED] if state == State.EXPIRED else list(OPEN_STATES)
    ended_now = HeavyCall.objects.filter(pk=call_id, state__in=open_states).update(state=state, finished_at=now)
    call = HeavyCall.objects.filter(pk=call_id).first()
    if call is None or call.state == State.RUNNING:
        return False
    lease = admission_of(call).lease()
    lease.release()
    if ended_now:
        ended(call, lease)
    if purge:
        discard_message(call)
    return bool(ended_now)


def expire(call):
    """A queued call past its deadline is expired, even before a worker sees its message (which is taken
    off the broker)."""
    if call.state == State.QUEUED and timezone.now() >= call.expires_at:
        end_unstarted(call.pk, State.EXPIRED, purge=True)
        call.refresh_from_db()
    return call


def discard_message(call):
    """Take a call that will never run off its queue's broker lists; best effort (the sweep retries)."""
    try:
        messages.discard(call.pk, call.queue)
    except Exception as ex:  # noqa: BLE001 - the row says it ended; a worker that gets the message skips it
        logger.warning('Message of ended call %s left on the broker (%s: %s); the sweep takes it out',
                       call.pk, type(ex).__name__, ex)


def ended(call, lease=None, count=True):
    """What follows any end: the counter (once per call: `count`), the log line and the completion notice."""
    if count:
        counters.record_end(call.queue, call.state)
    log_line(call, lease)
    notify.publish(call.pk, call.state)


# --- the sweep's and retention's transitions (workers.sweep, workers.retention) --------------------------

def overdue(now=None, limit=500):
    """Queued calls whose queue deadline passed (they will never run), oldest deadline first."""
    now = now or timezone.now()
    overdue_calls = HeavyCall.objects.filter(state=State.QUEUED, expires_at__lte=now).order_by('expires_at')
    return list(overdue_calls[:limit])


def maybe_lost(grace_seconds, stale_seconds, now=None, limit=500):
    """Calls that may have lost their message: queued for more than `grace_seconds` and before their
    deadline, or running with a heartbeat older than `stale_seconds` (their worker is gone)."""
    now = now or timezone.now()
    queued = Q(state=State.QUEUED, created_at__lt=now - timedelta(seconds=grace_seconds), expires_at__gt=now)
    stale = Q(state=State.RUNNING) & (Q(heartbeat_at__isnull=True) |
                                      Q(heartbeat_at__lt=now - timedelta(seconds=stale_seconds)))
    return list(HeavyCall.objects.filter(queued | stale).order_by('created_at')[:limit])


def redeliver(call, stale_seconds, now=None):
    """Publish again the message of a call that lost it (same task id): a queued call before its
    deadline, or a running one whose worker is gone (the next delivery takes over, see `start`). Reads the
    row again first; returns whether it was sent. A message found later as well is a duplicate, which
    `start` drops."""
    now = now or timezone.now()
    fresh = HeavyCall.objects.filter(pk=call.pk).first()
    if fresh is None:
        return False
    if fresh.state == State.QUEUED:
        if now >= fresh.expires_at:
            return False
    elif fresh.state != State.RUNNING or (fresh.heartbeat_at is not None and
                                          fresh.heartbeat_at >= now - timedelta(seconds=stale_seconds)):
        return False
    send(fresh)
    logger.warning('Heavy call %s (%s) had no message on the broker; published it again', fresh.pk,
                   fresh.state)
    return True


def forget_finished(before, limit=500):
    """Delete up to `limit` calls that ended before `before`, with their stored results, in one
    transaction (a call is never left without its result, nor a result without its call); return how many
    calls were deleted."""
    from django_celery_results.models import TaskResult
    with transaction.atomic():
        ids = list(HeavyCall.objects.filter(state__in=FINAL_STATES, finished_at__lt=before)
                   .order_by('finished_at').values_list('pk', flat=True)[:limit])
        if ids:
            TaskResult.objects.filter(task_id__in=ids).delete()
            HeavyCall.objects.filter(pk__in=ids).delete()
    return len(ids)


# --- the read side ------------------------------------------------------------------------------------------

def admission_of(call):
    return Admission.from_json(call.admission, token=call.pk)


def result(call):
    """The stored result of a succeeded call (the Celery result backend holds it, by task id)."""
    text = stored_result(call.pk)
    return json.loads(text) if text else None


def error_of(call):
    """What a client is told about a call that didn't succeed."""
    return call.error or {State.CANCELLED: CANCELLED, State.EXPIRED: EXPIRED}.get(call.state, FAILED)


def answer(call):
    """(status, body) the in-request endpoint would have given for a call that ended: 200 with its result;
    a failure's own status and body; 503 for a call that expired unrun, 409 for one that was cancelled."""
    if call.state == State.SUCCEEDED:
        return 200, result(call)
    if call.state == State.FAILED:
        return call.error_status or 500, call.error_body or {'detail': error_of(call), 'error_code': 'call_failed'}
    if call.state == State.EXPIRED:
        return 503, {'detail': EXPIRED, 'error_code': 'expired'}
    return 409, {'detail': CANCELLED, 'error_code': 'cancelled'}


def position(call):
    """1-based place of a queued call among the queued calls of its queue (priority, then age)."""
    if call.state != State.QUEUED:
        return None
    ahead = HeavyCall.objects.filter(queue=call.queue, state=State.QUEUED).filter(
        Q(priority__lt=call.priority) | Q(priority=call.priority, created_at__lt=call.created_at)).count()
    return ahead + 1


# What a waiting request reads again: enough to answer as the task or as the in-request endpoint would.
WAIT_FIELDS = ['state', 'started_at', 'finished_at', 'error', 'error_status', 'error_body']


HOLD_CONNECTION_SECONDS = 1.0


def wait(call, seconds):
    """Wait up to `seconds` for `call` to end; keeps `call`'s state and timings fresh; True when it ended.

    A request that waits longer than HOLD_CONNECTION_SECONDS gives its database connection back between
    looks (Django opens a new one for the next): a host holds dozens of waiting requests, and PostgreSQL
    would otherwise keep a connection open for each of them.
    """
    started = time.monotonic()

    def finished():
        call.refresh_from_db(fields=WAIT_FIELDS)
        if call.state in FINAL_STATES:
            return True
        if time.monotonic() - started >= HOLD_CONNECTION_SECONDS and not connection.in_atomic_block:
            connection.close()
        return False
    return notify.wait_for(call.pk, finished, seconds)


def ms_between(start_at, end_at):
    if start_at is None or end_at is None:
        return None
    return max(int((end_at - start_at).total_seconds() * 1000), 0)


def log_line(call, lease=None):
    """The call's one `ocl_capacity` line: what admission decided plus what happened in the queue."""
    admission = admission_of(call)
    record = log_record(admission)
    if not record:
        return  # the limiter was off for this call: no counting, no line
    record.update({
        'queue': call.queue,
        'task_id': call.pk,
        'state': call.state,
        'wait_ms': ms_between(call.created_at, call.started_at or call.finished_at),
        'run_ms': ms_between(call.started_at, call.finished_at),
        'held_ms': ms_between(call.created_at, call.finished_at) if admission.holding else None,
        'attempts': call.attempts or None,
        'lease_lost': True if (lease is not None and lease.lease_lost) or call.lease_lost else None,
        'error': (lease.error if lease is not None and lease.error else None) or call.limiter_error
        or record.get('error') or (call.error[:300] if call.error else None),
    })
    try:
        emit(record)
    except Exception:  # noqa: BLE001 - a log line never fails a call
        logger.exception('Heavy call %s: the log line failed', call.pk)
