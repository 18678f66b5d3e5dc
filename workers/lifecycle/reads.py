"""The read side of calls and their work: the stored result, the answer the in-request endpoint would give,
a queued work's position, when it should start and finish, waiting for its end, and a call's log line. The
only code that reads stored results (django-celery-results' TaskResult, by the work's id)."""
import json
import logging
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from celery import states
from django.conf import settings
from django.db import connection
from django.db.models.functions import Length, Substr
from django.db.models import Q, Subquery
from django.utils import timezone

from capacity.admission import Admission, log_record
from capacity.config import get_config
from capacity.keys import run_field
from capacity.logs import emit
from capacity.store import Unknown, get_store
from workers import estimates, lanes, messages, notify
from workers.lifecycle.seen import CANCELLED, EXPIRED, seen
from workers.models import FINAL_STATES, Call, State, Work

logger = logging.getLogger('heavy_lanes')


def admission_of(call):
    return Admission.from_json(call.admission, token=call.pk)


def stored_result(work_id):
    """The JSON text of a work's stored successful result, or None."""
    from django_celery_results.models import TaskResult
    return TaskResult.objects.filter(task_id=work_id, status=states.SUCCESS).values_list(
        'result', flat=True).first()


class StoredJSON:
    """A work's stored result as JSON text, read from the database in slices as it is sent (api.renderers):
    an API process serving the largest answer MAX_ANSWER_BYTES admits (32 MB) holds a slice of it at a time,
    not the text (nor, as before, its parsed objects and a rendering of them: hundreds of MB per read, kept
    by the process after). A text a completion notice brought, or one of at most one slice, is held whole.
    A result deleted while it is being sent (retention, days later) ends the text early."""

    def __init__(self, work_id, text=None, length=None):
        self.work_id, self.text = work_id, text
        self.length = len(text) if text is not None else length

    def __len__(self):
        return self.length

    def slices(self, size=None):
        """The text in slices of `size` characters (RESULT_SLICE_CHARACTERS)."""
        size = size or settings.RESULT_SLICE_CHARACTERS
        if self.text is not None:
            yield from (self.text[start:start + size] for start in range(0, self.length, size))
            return
        from django_celery_results.models import TaskResult
        rows = TaskResult.objects.filter(task_id=self.work_id, status=states.SUCCESS)
        for start in range(0, self.length, size):
            part = rows.annotate(part=Substr('result', start + 1, size)).values_list('part', flat=True).first()
            if not part:
                return
            yield part

    def whole(self):
        return self.text if self.text is not None else ''.join(self.slices())


def result(call, result_text=None):
    """The stored result of a call that succeeded (its work's, by the work's id); `result_text`: the text
    a completion notice brought (workers.notify), so it isn't read again."""
    text = result_text or stored_result(call.work_id)
    return json.loads(text) if text else None


def result_json(call, result_text=None):
    """result(), unparsed and unread: a StoredJSON the API sends as it is stored, or None."""
    if result_text:
        return StoredJSON(call.work_id, text=result_text)
    from django_celery_results.models import TaskResult
    length = TaskResult.objects.filter(task_id=call.work_id, status=states.SUCCESS).annotate(
        length=Length('result')).values_list('length', flat=True).first()
    if length is None:
        return None
    if length <= settings.RESULT_SLICE_CHARACTERS:
        return StoredJSON(call.work_id, text=stored_result(call.work_id))
    return StoredJSON(call.work_id, length=length)


def answer(call, result_text=None):
    """(status, body) the in-request endpoint would have given for a call that ended: 200 with its result;
    its work's failure status and body; 503 for one that expired unrun, 409 for one that was cancelled."""
    work = call.work
    now = seen(call, work)
    if now.state == State.SUCCEEDED:
        return 200, result_json(call, result_text)
    if now.state == State.FAILED:
        return work.error_status or 500, work.error_body or {'detail': now.error, 'error_code': 'call_failed'}
    if now.state == State.EXPIRED:
        return 503, {'detail': EXPIRED, 'error_code': 'expired'}
    return 409, {'detail': CANCELLED, 'error_code': 'cancelled'}


def position(work):
    """1-based place of a queued work among the queued work of its queue (priority, then age)."""
    if work.state != State.QUEUED:
        return None
    ahead = Work.objects.filter(queue=work.queue, state=State.QUEUED).filter(
        Q(priority__lt=work.priority) | Q(priority=work.priority, created_at__lt=work.created_at)).count()
    return ahead + 1


def published_position(work):
    """The place of a work whose message was just published: the messages waiting in its queue at its
    priority and before it, its own included (messages.ahead, a few LLENs), where `position` counts the
    queued rows, which grows with the queue (2.5 ms a 202 with a queue of a few thousand). It leaves out the
    few messages a worker took and hasn't started yet. The row count when the broker can't be read."""
    if work.state != State.QUEUED:
        return None
    try:
        return max(messages.ahead(work.queue, work.priority), 1)
    except redis.RedisError:
        return position(work)


RUN_TIME_KEPT_SECONDS = 1.0  # how long a process uses a run time it read (s)
_run_times = weakref.WeakKeyDictionary()  # lane store -> {queue: (seconds or None, monotonic expiry)}


def run_seconds(queue):
    """The measured mean run time of `queue`'s calls, s (capacity.keys.run_field), or None: nothing
    measured yet, or the lane store can't say (a hint is never worth an error).

    A process reads it from the lane store at most once a RUN_TIME_KEPT_SECONDS per queue: it is a mean over
    the queue's calls that moves a little at each release, and every 202 and poll of an unfinished call
    reads it (a round trip on the submission's path). A failed read is not kept."""
    store = get_store()
    kept = _run_times.setdefault(store, {})
    now = time.monotonic()
    seconds, until = kept.get(queue, (None, 0.0))
    if until > now:
        return seconds
    ms = store.hold(run_field(queue))
    if isinstance(ms, Unknown):
        return None
    seconds = ms / 1000 if isinstance(ms, int) else None
    kept[queue] = (seconds, now + RUN_TIME_KEPT_SECONDS)
    return seconds


def estimate(work, place=None, now=None, config=None):
    """When an unfinished work is expected to start and finish (workers.estimates), from its queue's
    measured run time, its pool size and the work running on it."""
    if work.state not in (State.QUEUED, State.RUNNING):
        return estimates.UNKNOWN
    run_s = run_seconds(work.queue)
    if run_s is None:
        return estimates.UNKNOWN
    now = now or timezone.now()
    if work.state == State.RUNNING:
        return estimates.running((now - (work.started_at or now)).total_seconds(), run_s)
    pool = lanes.get_queue(work.queue).pool_size(config or get_config())
    # A resize may leave a few more running than the pool: read a few more.
    started = Work.objects.filter(queue=work.queue, state=State.RUNNING).values_list(
        'started_at', flat=True)[:max(pool, 0) * 2 + 8]
    running = [(now - at).total_seconds() for at in started if at is not None]
    return estimates.queued(place or position(work), pool, run_s, running)


@dataclass(frozen=True)
class Progress:
    """Where an unfinished call stands for its client: its work's place in its queue, when it should start
    and finish (None: unknown), and the poll hint (Retry-After, s; None once finished)."""

    position: int | None = None
    start_at: datetime | None = None
    finish_at: datetime | None = None
    poll_after: int | None = None


def progress(call, just_published=False):
    """The Progress of `call` now: its work's position, its queue's measured estimate and the poll hint from
    it. Without a measured run time the hint is 1 s while running, else about the position (1–10 s).
    `just_published`: this request published the call's work a moment ago (published_position)."""
    work = call.work
    now_seen = seen(call, work)
    if now_seen.finished:
        return Progress()
    place = published_position(work) if just_published else position(work)
    now = timezone.now()
    config = get_config()
    expected = estimate(work, place=place, now=now, config=config)
    hint = estimates.poll_after(expected, config.retry_after.min, config.retry_after.max)
    if hint is None:
        hint = 1 if work.state == State.RUNNING else max(1, min(place or 1, 10))

    def at(seconds):
        return None if seconds is None else now + timedelta(seconds=seconds)
    return Progress(position=place, start_at=at(expected.start_in), finish_at=at(expected.finish_in),
                    poll_after=hint)


# Waiting for the end of a call's work.

WORK_FIELDS = ['state', 'started_at', 'finished_at', 'error', 'error_status', 'error_body', 'heartbeat_at',
               'shared', 'rows_done']
HOLD_CONNECTION_SECONDS = 1.0


@contextmanager
def watching(work_id):
    """A watch on the end of the work `work_id` (workers.notify) for `wait`, made before the work is
    published so that no look at its row is needed before its notice."""
    hub = notify.get_hub()
    watch = hub.watch(work_id)
    try:
        yield watch
    finally:
        hub.unwatch(watch)


@dataclass(frozen=True)
class Waited:
    """How a wait ended: whether the call ended for its owner, and the result's text when a notice
    brought it (then the rows weren't read again: the call's timings are as they were)."""

    ended: bool
    result_text: str | None = None


def wait(call, seconds, watch=None, for_answer=False):
    """Wait up to `seconds` for `call` to end for its owner; keeps `call` and `call.work` fresh; a Waited.

    `watch`: the notice watch the caller registered before the work was published (workers.notify).
    `for_answer`: the caller needs only what the in-request endpoint would answer: a notice that carries
    the work's result ends the wait without reading the rows (only an unshared work's end carries it:
    nobody else could have cancelled the call meanwhile).

    A waiting request gives its database connection back between looks: at once to the process's pool
    (api/settings.py, DATABASE_POOL_SIZE), else once it has waited HOLD_CONNECTION_SECONDS (Django opens a
    new one for the next look): a host holds dozens of waiting requests, and PostgreSQL would otherwise
    keep a connection open for each of them.
    """
    started = time.monotonic()
    pooled = bool(connection.settings_dict.get('OPTIONS', {}).get('pool'))
    brought = []

    def rest():
        if (pooled or time.monotonic() - started >= HOLD_CONNECTION_SECONDS) and not connection.in_atomic_block:
            connection.close()

    def finished():
        look_again(call)
        if seen(call, call.work).finished:
            return True
        rest()
        return False

    def ended_by(notice):
        if notice.state != State.SUCCEEDED or notice.result is None:
            return False
        call.work.state, call.work.answer_count = State.SUCCEEDED, notice.count
        brought.append(notice.result)
        return True
    if watch is not None:
        rest()  # no first look (wait_for): the connection goes back before the wait, not after it
    done = notify.wait_for(call.work_id, finished, seconds, watch=watch, ended_by=ended_by if for_answer else None,
                           among=ended_among)
    return Waited(done, brought[0] if brought else None)


def ended_among(work_ids):
    """Of the works `work_ids`, those that ended or have a cancelled call, in one query: the periodic look
    of every request waiting in this process (notify.Hub.ended_lately). The connection goes back after it,
    as after a waiting request's own look: the thread that made it goes on waiting."""
    found = set(Work.objects.filter(pk__in=work_ids).filter(
        Q(state__in=FINAL_STATES) | Q(calls__cancelled_at__isnull=False)).values_list('pk', flat=True))
    if not connection.in_atomic_block:
        connection.close()
    return found


def look_again(call):
    """Read `call`'s cancellation and its work's WORK_FIELDS again, in one query (a waiting request looks
    after a bare notice, and when the process's shared look, `ended_among`, found its work ended)."""
    cancelled = Call.objects.filter(pk=call.pk).values('cancelled_at')[:1]
    row = Work.objects.filter(pk=call.work_id).values(*WORK_FIELDS, call_cancelled_at=Subquery(cancelled)).first()
    if row is None:
        raise Work.DoesNotExist(f'Work {call.work_id} of call {call.pk} is gone')
    call.cancelled_at = row.pop('call_cancelled_at')
    for name, value in row.items():
        setattr(call.work, name, value)


def ms_between(start_at, end_at):
    if start_at is None or end_at is None:
        return None
    return max(int((end_at - start_at).total_seconds() * 1000), 0)


def log_line(call, work, lease=None):
    """The call's one `ocl_capacity` line: what admission decided for it plus what happened to its work."""
    admission = admission_of(call)
    record = log_record(admission)
    if not record:
        return  # the limiter was off for this call: no counting, no line
    now = seen(call, work)
    record.update({
        'queue': work.queue,
        'task_id': call.pk,
        'state': now.state,
        'wait_ms': ms_between(call.created_at, now.started_at or now.finished_at),
        'run_ms': ms_between(now.started_at, now.finished_at),
        'held_ms': ms_between(call.created_at, now.finished_at) if admission.holding else None,
        'attempts': work.attempts or None,
        'served_as': call.served_as,
        'work_id': work.pk if work.pk != call.pk else None,  # the work (or stored result) that answered it
        'lease_lost': True if (lease is not None and lease.lease_lost) or work.lease_lost else None,
        'error': (lease.error if lease is not None and lease.error else None) or work.limiter_error
        or record.get('error') or (now.error[:300] if now.error and now.state == State.FAILED else None),
    })
    try:
        emit(record)
    except Exception:  # noqa: BLE001 - a log line never fails a call
        logger.exception('Heavy call %s: the log line failed', call.pk)
