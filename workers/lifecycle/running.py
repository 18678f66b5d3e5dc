"""The worker's side of a call: claim it, beat while it runs, record its success or failure."""
import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta

from celery import states
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from capacity.config import get_config
from workers.celery import app
from workers.lifecycle import sharing, statements
from workers.lifecycle.ending import ended, note_limiter
from workers.lifecycle.reads import admission_of
from workers.lifecycle.words import ERROR_LENGTH, HARD_LIMIT, ROW_WAIT_SECONDS
from workers.models import OPEN_STATES, HeavyCall, State


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
    elif holder_gone(call, worker, now, stale_seconds := get_config().lease_seconds):
        # Compare and set: of two deliveries taking over at once, one wins.
        claim = claim.filter(state=State.RUNNING, worker=call.worker, heartbeat_at=call.heartbeat_at)
    else:
        return Start(BUSY, redelivered, retry_in=busy_retry_in(call, now, stale_seconds))
    # A first delivery marks its queued followers running too: in the same statement on PostgreSQL.
    together = statements.available() and call.state == State.QUEUED and not redelivered
    if together:
        claimed = statements.claim_queued(call.pk, worker, now)
    else:
        claimed = claim.update(state=State.RUNNING, started_at=now, attempts=F('attempts') + 1, worker=worker,
                               heartbeat_at=now)
    if not claimed:
        fresh = HeavyCall.objects.filter(pk=call.pk).values_list('state', flat=True).first()
        if fresh == State.RUNNING:
            return Start(BUSY, redelivered, retry_in=get_config().lease_seconds)
        return Start(ENDED, redelivered)
    call.state, call.started_at, call.attempts = State.RUNNING, now, call.attempts + 1
    call.worker, call.heartbeat_at = worker, now
    if not redelivered and not together:
        sharing.started(call)
    return Start(RUN, redelivered)


def claim_first_available():
    """Whether `claim_first` can claim a call here (else it always answers None)."""
    return statements.available()


def claim_first(call_id, worker):
    """A first delivery's claim of a queued call without reading its row first (PostgreSQL: one statement,
    workers.lifecycle.statements.claim_first, followers included): the claimed row, running on `worker`, or
    None — the call is not queued, was delivered before, is past its queue deadline, its row isn't
    committed yet, or the database is another — and then `load` and `start` decide, as for any delivery."""
    if not claim_first_available():
        return None
    return statements.claim_first(call_id, worker, timezone.now())


def busy_retry_in(call, now, stale_seconds):
    """When to look again at a call another worker runs: just after its heartbeat would go stale."""
    age = (now - call.heartbeat_at).total_seconds() if call.heartbeat_at else stale_seconds
    return max(1.0, stale_seconds - age + 1.0)


def beat(call, worker):
    """The running worker is alive; False when the call is no longer its own (cancelled or taken over)."""
    now = timezone.now()
    return bool(HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING, worker=worker).update(heartbeat_at=now))


def succeed(call, result, worker=None):
    """Record that a running call succeeded with `result`: the result and the state in one transaction.

    False (and nothing stored) when the call is no longer running on `worker` (cancelled meanwhile). The
    caller releases the leases, then calls `ended`. `call.result_text` is then the stored result's JSON
    text when the end announces it (workers.notify): the update found the call not detached, and being
    ended it can't be detached or cancelled any more, so what its owner waits for is this result. A
    detached leader (its owner cancelled it, its followers wait for the work) is ended by a second
    update and announced bare; `call.work_result_text` is the text either way, for its followers.
    """
    finished_at = timezone.now()
    if statements.available():  # one statement (workers.lifecycle.statements)
        row, text = result_row(call.pk, result)
        owned = statements.succeed_with_result(call.pk, worker, finished_at, row, RESULT_UPDATE_FIELDS)
        if owned is None:
            return False
    else:
        running = HeavyCall.objects.filter(pk=call.pk, state=State.RUNNING)
        if worker is not None:
            running = running.filter(worker=worker)
        with transaction.atomic():
            owned = running.filter(detached_at__isnull=True).update(state=State.SUCCEEDED,
                                                                    finished_at=finished_at, error='')
            if not owned and not running.update(state=State.SUCCEEDED, finished_at=finished_at, error=''):
                return False
            text = store_result(call.pk, result)
    call.state, call.finished_at, call.error = State.SUCCEEDED, finished_at, ''
    call.work_result_text, call.result_text = text, (text if owned else None)
    return True


RESULT_UPDATE_FIELDS = ['status', 'result', 'content_type', 'content_encoding', 'meta', 'task_name', 'worker',
                        'task_args', 'task_kwargs', 'date_done']


def result_row(call_id, result):
    """The call's result row (django-celery-results' TaskResult, unsaved) as the result backend writes it
    — encoded by the backend, with the extended fields of the task running now — and its result text."""
    from celery import current_task
    from django_celery_results.models import TaskResult

    backend = app.backend
    content_type, content_encoding, data = backend.encode_content(result)
    request = getattr(current_task, 'request', None)
    encoded = lambda value: None if value is None else backend.encode_content(value)[2]  # noqa: E731
    meta = encoded({'children': backend.current_task_children(request)})
    row = TaskResult(task_id=call_id, status=states.SUCCESS, result=data, content_type=content_type,
                     content_encoding=content_encoding, meta=meta,
                     task_name=getattr(request, 'task', None), worker=getattr(request, 'hostname', None),
                     task_args=encoded(getattr(request, 'argsrepr', None)),
                     task_kwargs=encoded(getattr(request, 'kwargsrepr', None)))
    return row, data


def store_result(call_id, result):
    """Write the call's result row (`result_row`) in one statement; return its result text.

    Not `app.backend.store_result`: that looks the row up first and inserts it in a savepoint
    (get_or_create), four round trips to the database where one does, on the path every call takes while
    the next call waits in its queue. The row can't exist yet (the guarded update before this one is the
    only way to succeed, once); should it, it is overwritten, as the backend would."""
    from django_celery_results.models import TaskResult

    row, data = result_row(call_id, result)
    TaskResult.objects.bulk_create([row], update_conflicts=True, unique_fields=['task_id'],
                                   update_fields=RESULT_UPDATE_FIELDS)
    return data


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
