"""The worker's side of a work: claim it, beat while it runs, record how it ended."""
import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta

from celery import states
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from capacity.config import get_config
from workers.celery import app
from workers.lifecycle import statements
from workers.lifecycle.transitions import move
from workers.models import OPEN_STATES, Call, State, Work

ERROR_LENGTH = 2000
ROW_WAIT_SECONDS = 5.0
SOFT_LIMIT = 'The call was stopped by its time limit ({seconds} s, max_hold_seconds) and did not finish.'
HARD_LIMIT = ('The call was stopped by its hard time limit ({seconds} s): its worker process did not end it '
              'at the soft limit and was killed.')


def load(work_id, wait=None):
    """The work's first call with its work (`call.work`), waiting up to ROW_WAIT_SECONDS for the API's
    commit; None if it never comes."""
    deadline = time.monotonic() + (ROW_WAIT_SECONDS if wait is None else wait)
    pause = 0.002  # the commit is usually a millisecond or two behind the message: look again soon
    while True:
        call = Call.objects.select_related('work').filter(pk=work_id).first()
        if call is not None or time.monotonic() >= deadline:
            return call
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


@dataclass(frozen=True)
class Start:
    """What `start` decided for one delivery of a work's message."""

    kind: str          # RUN, EXPIRE, ENDED or BUSY
    redelivered: bool = False
    retry_in: float = 0.0  # BUSY: seconds until the running worker's heartbeat would be stale


RUN, EXPIRE, ENDED, BUSY = 'run', 'expire', 'ended', 'busy'


def worker_name(node):
    return f'{node} pid {os.getpid()}'


def holder_gone(work, me, now, stale_seconds):
    """Whether the worker that last marked `work` running is gone (so this delivery may take over).

    Gone: it never beat, or its heartbeat is older than `stale_seconds`, or it ran on this node in a
    process that no longer exists (a pool process killed: the broker redelivers at once).
    """
    if not work.worker or work.heartbeat_at is None or work.heartbeat_at < now - timedelta(seconds=stale_seconds):
        return True
    node, _, pid = work.worker.rpartition(' pid ')
    my_node = me.rpartition(' pid ')[0]
    if node != my_node or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True  # this process runs one work at a time: its earlier run of it is over
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def start(work, worker):
    """Claim `work` for `worker` ('<node> pid <pid>'): a queued work (`start`), or a running one whose
    worker is gone (`take_over`, compare and set on that worker's heartbeat); see Start. Updates `work` to
    what was written."""
    now = statements.db_now()  # the clock heartbeats are written with, whatever this host's says
    if work.state == State.QUEUED and now >= work.expires_at:
        return Start(EXPIRE)
    if work.state not in OPEN_STATES:
        return Start(ENDED)
    redelivered = work.attempts > 0
    # A run starts its rows afresh: what a gone worker had done is not this run's progress.
    claim = {'started_at': now, 'attempts': F('attempts') + 1, 'worker': worker, 'heartbeat_at': now,
             'rows_done': 0}
    stale_seconds = get_config().lease_seconds
    if work.state == State.QUEUED:
        claimed = move('start', work.pk, **claim)
    elif holder_gone(work, worker, now, stale_seconds):
        # Of two deliveries taking over at once, one wins: the other finds the heartbeat changed.
        claimed = move('take_over', work.pk, guard={'worker': work.worker, 'heartbeat_at': work.heartbeat_at},
                       **claim)
    else:
        return Start(BUSY, redelivered, retry_in=busy_retry_in(work, now, stale_seconds))
    if not claimed:
        fresh = Work.objects.filter(pk=work.pk).values_list('state', flat=True).first()
        if fresh == State.RUNNING:
            return Start(BUSY, redelivered, retry_in=stale_seconds)
        return Start(ENDED, redelivered)
    work.state, work.started_at, work.attempts = State.RUNNING, now, work.attempts + 1
    work.worker, work.heartbeat_at, work.rows_done = worker, now, 0
    return Start(RUN, redelivered)


def claim_first_available():
    """Whether `claim_first` can claim a work here (else it always answers None)."""
    return statements.available()


def claim_first(work_id, worker):
    """A first delivery's claim of a queued work without reading it first (PostgreSQL: one statement,
    sql/claim_first.sql): its first call with the claimed work (`call.work`), running on `worker`, or None
    — the work is not queued, was delivered before, is past its queue deadline, its row isn't committed
    yet, or the database is another — and then `load` and `start` decide, as for any delivery."""
    if not claim_first_available():
        return None
    return statements.claim_first(work_id, worker)


def busy_retry_in(work, now, stale_seconds):
    """When to look again at a work another worker runs: just after its heartbeat would go stale."""
    age = (now - work.heartbeat_at).total_seconds() if work.heartbeat_at else stale_seconds
    return max(1.0, stale_seconds - age + 1.0)


def beat(work, worker):
    """The running worker is alive, by the database's clock (so a host's own clock can't make it look dead or
    alive); False when the work is no longer its own (cancelled or taken over)."""
    return bool(Work.objects.filter(pk=work.pk, state=State.RUNNING, worker=worker).update(heartbeat_at=Now()))


def note_rows(work, rows_done):
    """How far `work`'s run has got: `rows_done` of its rows, for its calls' `progress` (workers.progress
    batches these writes). Not a state change: written only while the run is its worker's (False if not)."""
    return bool(Work.objects.filter(pk=work.pk, state=State.RUNNING, worker=work.worker).update(
        rows_done=rows_done))


def succeed(work, result, worker=None):
    """Record that a running work succeeded with `result`: the state and the result (the row
    django-celery-results' backend writes for a task's result) together, so a poll that sees `succeeded`
    finds the result and a work cancelled meanwhile never gets one. On PostgreSQL in one statement
    (statements.succeed: a pool process waits out every round trip between one call and the next), else
    in one transaction through the backend itself.

    Returns the result's JSON text (what its completion notice may carry), or None — and nothing is
    stored — when the work is no longer running on `worker`. The caller releases the leases, then ends it
    (workers.lifecycle.ending.end_with_release)."""
    from celery import current_task

    finished_at = timezone.now()
    request = getattr(current_task, 'request', None)
    count = answer_count(result)
    if statements.available():
        row = result_row(result, request)
        ended = statements.succeed(work.pk, worker, finished_at, count, row)
        if ended is None:
            return None
        work.holders, work.shared = ended
        text = row['result']
    else:
        with transaction.atomic():
            if not move('succeed', work.pk, guard={'worker': worker} if worker else None,
                        finished_at=finished_at, error='', answer_count=count):
                return None
            app.backend.store_result(work.pk, result, states.SUCCESS, request=request)
            joined(work)
        text = app.backend.encode_content(result)[2]
    work.state, work.finished_at, work.error, work.answer_count = State.SUCCEEDED, finished_at, '', count
    return text


def result_row(result, request):
    """The columns of a success's result row as django-celery-results' DatabaseBackend._store_result writes
    them (its own encoding, meta and extended properties), for statements.succeed; the result is encoded
    once, and that text is also what the completion notice carries. Its tests compare the row with the
    backend's own."""
    backend = app.backend
    content_type, content_encoding, text = backend.encode_content(backend.encode_result(result, states.SUCCESS))
    meta = {**backend._get_meta_from_request(request), 'children': backend.current_task_children(request)}
    extended = backend._get_extended_properties(request, None)
    return {'status': states.SUCCESS, 'result': text, 'content_type': content_type,
            'content_encoding': content_encoding, 'meta': backend.encode_content(meta)[2],
            'traceback': extended['traceback'], 'periodic_task_name': extended['periodic_task_name'],
            'task_name': extended['task_name'], 'task_args': extended['task_args'],
            'task_kwargs': extended['task_kwargs'], 'result_worker': extended['worker']}


def answer_count(result):
    """The candidates in an answer, all rows together (OCL's `num_returned` on `$match`; 0 for a `$rerank`
    answer, whose rows have none); None for an answer that isn't a list."""
    if not isinstance(result, list):
        return None
    return sum(len(entry.get('results') or []) for entry in result if isinstance(entry, dict))


def joined(work):
    """Read again which calls point at `work` (`holders`, `shared`), in the transaction that ended it: calls
    joined it while it ran on this worker, and its end counts, logs and announces them all. A join needs the
    work open (a guarded UPDATE under the row's lock), so none can come after this."""
    holders, shared = Work.objects.filter(pk=work.pk).values_list('holders', 'shared').get()
    work.holders, work.shared = holders, shared


@dataclass(frozen=True)
class Failure:
    """Why a work failed: the message a poll shows, and what the in-request endpoint would have answered."""

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


def fail(work, failure, worker=None, transition='fail'):
    """Record that a running work failed (a Failure, or a message); False when it is no longer running on
    `worker`. Its calls' usage is given back by that alone (a failed call is not charged). The caller
    releases the leases, then ends it."""
    if not isinstance(failure, Failure):
        failure = Failure.internal(str(failure))
    finished_at = timezone.now()
    error = failure.message[:ERROR_LENGTH]
    with transaction.atomic():
        if not move(transition, work.pk, guard={'worker': worker} if worker else None, finished_at=finished_at,
                    error=error, error_status=failure.status, error_body=failure.body):
            return False
        joined(work)
    work.state, work.finished_at, work.error = State.FAILED, finished_at, error
    work.error_status, work.error_body = failure.status, failure.body
    return True


def time_out(work_id, seconds, node):
    """A work whose pool process its worker killed at the hard time limit (`seconds`): end it `failed`
    with that reason and release its leases (from the worker's main process, where Celery enforces the
    limit). Only a run on `node` is ended: a later delivery elsewhere owns the work. Idempotent."""
    from workers.lifecycle.ending import ended, worker_lease

    work = Work.objects.filter(pk=work_id).first()
    if work is None or work.state != State.RUNNING or not work.worker.startswith(f'{node} pid '):
        return False
    if not fail(work, Failure.time_limit(HARD_LIMIT.format(seconds=seconds)), worker=work.worker,
                transition='time_out'):
        return False
    lease = worker_lease(work)
    lease.release()
    ended(work, lease)
    return True
