"""The read side of a call: its admission, result, position, when it should start and finish, the answer
the in-request endpoint would give, waiting for its end, and its log line. The only code that reads stored
results."""
import json
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import states
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from capacity import failopen
from capacity.admission import Admission, log_record
from capacity.config import get_config
from capacity.keys import holds_key, run_field
from capacity.logs import emit
from capacity.store import get_store
from workers import estimates, lanes, notify
from workers.lifecycle.words import CANCELLED, EXPIRED, FAILED
from workers.models import HeavyCall, State

logger = logging.getLogger('heavy_lanes')


def admission_of(call):
    return Admission.from_json(call.admission, token=call.pk)


def stored_result(call_id):
    """The JSON text of a stored successful result, or None."""
    from django_celery_results.models import TaskResult
    return TaskResult.objects.filter(task_id=call_id, status=states.SUCCESS).values_list(
        'result', flat=True).first()


def result(call):
    """The stored result of a succeeded call (the Celery result backend holds it, by task id); a handle
    that shared its work shows its leader's. One that a notice brought (`wait`) isn't read again."""
    text = getattr(call, 'result_text', None) or stored_result(call.work_id)
    return json.loads(text) if text else None


def error_of(call):
    """What a client is told about a call that didn't succeed."""
    if call.detached_at is not None:
        return CANCELLED
    return call.error or {State.CANCELLED: CANCELLED, State.EXPIRED: EXPIRED}.get(call.state, FAILED)


def answer(call):
    """(status, body) the in-request endpoint would have given for a call that ended: 200 with its result;
    a failure's own status and body; 503 for a call that expired unrun, 409 for one that was cancelled."""
    if call.detached_at is not None:
        return 409, {'detail': CANCELLED, 'error_code': 'cancelled'}
    if call.state == State.SUCCEEDED:
        return 200, result(call)
    if call.state == State.FAILED:
        return call.error_status or 500, call.error_body or {'detail': error_of(call), 'error_code': 'call_failed'}
    if call.state == State.EXPIRED:
        return 503, {'detail': EXPIRED, 'error_code': 'expired'}
    return 409, {'detail': CANCELLED, 'error_code': 'cancelled'}


def position(call):
    """1-based place of a queued call among the queued calls of its queue (priority, then age); a
    follower's is its leader's (followers take no place: they have no message)."""
    if call.state != State.QUEUED or call.detached_at is not None:
        return None
    if call.leader_id is not None:
        call = HeavyCall.objects.filter(pk=call.leader_id).only('queue', 'state', 'priority', 'created_at').first()
        if call is None or call.state != State.QUEUED:
            return None
    ahead = HeavyCall.objects.filter(queue=call.queue, state=State.QUEUED, leader__isnull=True).filter(
        Q(priority__lt=call.priority) | Q(priority=call.priority, created_at__lt=call.created_at)).count()
    return ahead + 1


def run_seconds(queue):
    """The measured mean run time of `queue`'s calls, s (capacity.keys.run_field), or None: nothing
    measured yet, or the lane store can't be read (a hint is never worth an error)."""
    store = get_store()
    if not store.is_available():
        return None
    try:
        value = store.command('hget', holds_key(), run_field(queue))
    except Exception as ex:  # noqa: BLE001 - fail open: no estimate
        failopen.record(None, ex, 'run time read', store)
        return None
    return int(value) / 1000 if value is not None else None


def estimate(call, position=None, now=None, config=None):
    """When an unfinished call is expected to start and finish (workers.estimates), from its queue's
    measured run time, its pool size and the calls running on it; a follower's is its leader's."""
    if call.finished or call.detached_at is not None:
        return estimates.UNKNOWN
    work = call
    if call.leader_id is not None:
        work = HeavyCall.objects.filter(pk=call.leader_id).only(
            'queue', 'state', 'priority', 'created_at', 'started_at', 'detached_at').first()
        if work is None:
            return estimates.UNKNOWN
    run_s = run_seconds(work.queue)
    if run_s is None:
        return estimates.UNKNOWN
    now = now or timezone.now()
    if work.state == State.RUNNING:
        started = work.started_at or now
        return estimates.running((now - started).total_seconds(), run_s)
    if work.state != State.QUEUED:
        return estimates.UNKNOWN
    pool = lanes.get_queue(work.queue).pool_size(config or get_config())
    # A resize may leave a few more running than the pool: read a few more.
    running_now = HeavyCall.objects.filter(queue=work.queue, state=State.RUNNING, leader__isnull=True)
    started = running_now.values_list('started_at', flat=True)[:max(pool, 0) * 2 + 8]
    running = [(now - at).total_seconds() for at in started if at is not None]
    return estimates.queued(position or work_position(work), pool, run_s, running)


@dataclass(frozen=True)
class Progress:
    """Where an unfinished call stands for its client: its place in the queue, when it should start and
    finish (None: unknown), and the poll hint (Retry-After, s; None once finished)."""

    position: int | None = None
    start_at: datetime | None = None
    finish_at: datetime | None = None
    poll_after: int | None = None


def progress(call):
    """The Progress of `call` now: its position, its queue's measured estimate and the poll hint from it.

    Without a measured run time the hint is the old one: 1 s while running, else about the position
    (1–10 s).
    """
    if call.finished:
        return Progress()
    place = position(call) if call.seen_state == State.QUEUED else None
    now = timezone.now()
    config = get_config()
    expected = estimate(call, position=place, now=now, config=config)
    bounds = config.retry_after
    hint = estimates.poll_after(expected, bounds.min, bounds.max)
    if hint is None:
        hint = 1 if call.state == State.RUNNING else max(1, min(place or 1, 10))

    def at(seconds):
        return None if seconds is None else now + timedelta(seconds=seconds)
    return Progress(position=place, start_at=at(expected.start_in), finish_at=at(expected.finish_in),
                    poll_after=hint)


def work_position(work):
    return position(work) if work.state == State.QUEUED else None


# What a waiting request reads again: enough to answer as the task or as the in-request endpoint would.


WAIT_FIELDS = ['state', 'started_at', 'finished_at', 'error', 'error_status', 'error_body', 'detached_at']


HOLD_CONNECTION_SECONDS = 1.0


@contextmanager
def watching(call_id):
    """A watch on the end of `call_id` (workers.notify) for `wait`, made before the call is published so
    that no look at its row is needed before its notice."""
    hub = notify.get_hub()
    watch = hub.watch(call_id)
    try:
        yield watch
    finally:
        hub.unwatch(watch)


def wait(call, seconds, watch=None, for_answer=False):
    """Wait up to `seconds` for `call` to end; keeps `call`'s state and timings fresh; True when it ended.

    `watch`: the notice watch the caller registered before the call was published (workers.notify).
    `for_answer`: the caller needs only what the in-request endpoint would answer: a notice that carries
    the call's result ends the wait without reading the row (`call.state` is then fresh, its timings not,
    and `call.result_text` holds the result for `answer`).

    A waiting request gives its database connection back between looks: at once to the process's pool
    (api/settings.py, DATABASE_POOL_SIZE), else once it has waited HOLD_CONNECTION_SECONDS (Django opens a
    new one for the next look): a host holds dozens of waiting requests, and PostgreSQL would otherwise
    keep a connection open for each of them.
    """
    started = time.monotonic()
    pooled = bool(connection.settings_dict.get('OPTIONS', {}).get('pool'))

    def rest():
        if (pooled or time.monotonic() - started >= HOLD_CONNECTION_SECONDS) and not connection.in_atomic_block:
            connection.close()

    def finished():
        call.refresh_from_db(fields=WAIT_FIELDS)
        if call.finished:
            return True
        rest()
        return False

    def ended_by(notice):
        if notice.state != State.SUCCEEDED or notice.result is None:
            return False
        call.state, call.result_text = State.SUCCEEDED, notice.result
        return True
    if watch is not None:
        rest()  # no first look (wait_for): the connection goes back before the wait, not after it
    return notify.wait_for(call.pk, finished, seconds, watch=watch, ended_by=ended_by if for_answer else None)


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
        'served_as': call.served_as,
        'work_id': call.leader_id or None,  # the call whose work (or stored result) answered this one
        'detached': True if call.detached_at is not None else None,
        'lease_lost': True if (lease is not None and lease.lease_lost) or call.lease_lost else None,
        'error': (lease.error if lease is not None and lease.error else None) or call.limiter_error
        or record.get('error') or (call.error[:300] if call.error else None),
    })
    try:
        emit(record)
    except Exception:  # noqa: BLE001 - a log line never fails a call
        logger.exception('Heavy call %s: the log line failed', call.pk)
