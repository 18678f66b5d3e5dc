"""Run one admitted heavy call in a worker, with its leases handed over from the API.

Plain functions, callable and testable without a broker; workers.tasks wraps them in Celery tasks.

`run(call_id)`: wait briefly for the call's row (the API commits it right after publishing), skip a call
that was cancelled or whose queue deadline passed, mark it running, renew its leases (all or nothing; a
redelivered call takes them again), keep renewing while the work runs, release in `finally`, and record
the final state once. A lost lease is logged and never stops the work.

`end_unstarted(call_id, state)`: for a call that will never run (expired in its queue, or revoked), mark it
and release its leases; called from the worker's main process.
"""
import json
import logging
import os
import time

from django.db.models import F
from django.utils import timezone

from capacity import failopen
from capacity.config import get_config
from capacity.lease import Lease, LeaseRenewer
from capacity.logs import emit
from workers import notify, work
from workers.models import OPEN_STATES, HeavyCall, State

logger = logging.getLogger('heavy_lanes')
ROW_WAIT_SECONDS = 5.0
ERROR_LENGTH = 2000


class CallGone(Exception):
    """The call's row never appeared: the submission that published it didn't commit."""


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


def lease_for(call, lease_ms):
    admission = call.admission or {}
    return Lease(admission.get('keys', []), call.pk, lease_ms, holding=admission.get('holding', False))


def run(call_id, perform=None, worker=''):
    """Run the call `call_id` and return its result (None when it was skipped).

    The caller records success with `succeed` once the result is stored (the Celery task does it in
    on_success, after the result backend wrote the result); a failure is recorded here and re-raised.
    """
    perform = perform or work.perform
    call = load(call_id)
    if call is None:
        logger.warning('Heavy call %s has no row: its submission never committed; dropped', call_id)
        return None
    now = timezone.now()
    if call.state == State.QUEUED and now >= call.expires_at:
        end_unstarted(call_id, State.EXPIRED)
        return None
    if call.state not in OPEN_STATES:
        return None  # cancelled (or already finished) before it started: its leases were released then
    redelivered = call.attempts > 0
    config = get_config()
    # Renew before the call shows as running: from then on a dead worker's leases expire within
    # lease_seconds (before it, they last until the queue deadline, as for any queued call).
    lease = lease_for(call, config['lease_seconds'] * 1000)
    if lease.holding and not lease.renew():
        if not (redelivered and lease.retake(call.admission.get('limits', []))):
            lease.lease_lost = True
            logger.warning('Heavy call %s runs without its leases (lease_lost)', call_id)
    running_on = f'{worker} pid {os.getpid()}'
    started = HeavyCall.objects.filter(pk=call_id, state__in=OPEN_STATES).update(
        state=State.RUNNING, started_at=now, attempts=F('attempts') + 1, worker=running_on)
    if not started:
        release(call, lease)  # cancelled meanwhile
        return None
    # What the UPDATE wrote, without reading the row again (the work needs only its inputs).
    call.state, call.started_at, call.attempts, call.worker = State.RUNNING, now, call.attempts + 1, running_on
    earlier = stored_result(call_id) if redelivered else None
    if earlier is not None:
        # The earlier delivery stored its result and died before recording success: don't run it twice.
        release(call, lease)
        return json.loads(earlier)
    renewer = start_renewer(lease, config)
    try:
        result = perform(call)
    except Exception as ex:
        release(call, lease, renewer)
        finish(call_id, State.FAILED, error=f'{type(ex).__name__}: {ex}'[:ERROR_LENGTH], call=call)
        raise
    finally:
        release(call, lease, renewer)
    remember(call)
    return result


# The row of each call this process ran, for `succeed` (the task's on_success, right after run returns in
# the same process): finish then needn't read it again. Bounded: an entry whose on_success never came
# (the result couldn't be stored) is dropped with the oldest.
MAX_REMEMBERED = 64
_ran = {}


def remember(call):
    _ran[call.pk] = call
    while len(_ran) > MAX_REMEMBERED:
        del _ran[next(iter(_ran))]


def start_renewer(lease, config):
    """Renew the leases every renew_seconds while the call runs; None if there is nothing to renew.

    A renewer that can't start (no thread to be had) never stops the call: it runs on, and its leases
    expire lease_seconds after the renewal at its start.
    """
    if not lease.holding or lease.lease_lost:
        return None
    renewer = LeaseRenewer(lease, config['renew_seconds'], config['max_hold_seconds'])
    try:
        renewer.start()
    except Exception as ex:  # noqa: BLE001 - fail open, like every limiter error
        failopen.record(lease, ex, 'renewer start')
        return None
    return renewer


def release(call, lease, renewer=None):
    """Stop renewing, release the leases, and keep what the limiter met for the log line. Idempotent."""
    if renewer is not None:
        renewer.stop()
    if lease.released:
        return
    lease.release()
    if lease.lease_lost or lease.error:
        call.lease_lost, call.limiter_error = lease.lease_lost, (lease.error or '')[:300]
        HeavyCall.objects.filter(pk=call.pk).update(lease_lost=call.lease_lost, limiter_error=call.limiter_error)


def stored_result(call_id):
    from django_celery_results.models import TaskResult
    from celery import states
    row = TaskResult.objects.filter(task_id=call_id, status=states.SUCCESS).values_list('result', flat=True).first()
    return row


def succeed(call_id):
    """Record that a running call succeeded (its result is stored by the result backend)."""
    return finish(call_id, State.SUCCEEDED, call=_ran.pop(call_id, None))


def finish(call_id, state, error='', call=None):
    """Record a running call's final state unless it was cancelled meanwhile; log it and notify once.

    `call`: the row as this process last wrote it (run's copy), so it needn't be read again.
    """
    finished_at = timezone.now()
    updated = HeavyCall.objects.filter(pk=call_id, state=State.RUNNING).update(
        state=state, finished_at=finished_at, error=error)
    if not updated:
        return False
    if call is None:
        call = HeavyCall.objects.get(pk=call_id)
    else:
        call.state, call.finished_at, call.error = state, finished_at, error
    if state == State.FAILED:
        work.refund(call)
    log_line(call)
    notify.publish(call.pk, call.state)
    return True


def end_unstarted(call_id, state):
    """End a call that won't run (expired, revoked): mark it, release its leases, log it."""
    call = HeavyCall.objects.filter(pk=call_id).first()
    if call is None:
        return False
    now = timezone.now()
    ended = HeavyCall.objects.filter(pk=call_id, state__in=OPEN_STATES).update(state=state, finished_at=now)
    lease = lease_for(call, 0)
    lease.release()
    if ended:
        call.refresh_from_db()
        log_line(call, lease)
        notify.publish(call.pk, call.state)
    return bool(ended)


def ms_between(start, end):
    if start is None or end is None:
        return None
    return max(int((end - start).total_seconds() * 1000), 0)


def log_line(call, lease=None):
    """The call's one `ocl_capacity` line: what admission decided plus what happened in the queue."""
    record = dict((call.admission or {}).get('record') or {})
    if not record:
        return  # the limiter was off for this call: no counting, no line
    record.update({
        'queue': call.lane,
        'task_id': call.pk,
        'state': call.state,
        'wait_ms': ms_between(call.created_at, call.started_at or call.finished_at),
        'run_ms': ms_between(call.started_at, call.finished_at),
        'held_ms': ms_between(call.created_at, call.finished_at) if (call.admission or {}).get('holding') else None,
        'attempts': call.attempts or None,
        'lease_lost': True if (lease is not None and lease.lease_lost) or call.lease_lost else None,
        'error': (lease.error if lease is not None and lease.error else None) or call.limiter_error
        or record.get('error') or (call.error[:300] if call.error else None),
    })
    try:
        emit(record)
    except Exception:  # noqa: BLE001 - a log line never fails a call
        logger.exception('Heavy call %s: the log line failed', call.pk)
