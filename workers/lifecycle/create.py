"""A call's start in life: a new work with its first call and its message, in one transaction; or a new call
on a work that exists (joining it while it is open, or answered by its warm result)."""
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from capacity import counters
from capacity.admission import LEASE_MESSAGE_KEYS
from capacity.config import get_config, time_limits
from workers import notify, publisher
from workers.celery import LEASES_HEADER, TASK_NAME, app
from workers.lifecycle import statements
from workers.lifecycle.reads import log_line
from workers.models import OPEN_STATES, ServedAs, State, Work


def queued_lease_ms(config=None):
    """How long a queued work's leases last between renewals, ms: `lease_seconds` plus one sweep. While the
    work waits in its queue every sweep renews them (workers.sweep), so it waits counted however long; when
    nothing renews them (the API process died before the work's row was written, so no sweep sees it) they
    come back within this time, not at the queue deadline."""
    return int(((config or get_config()).lease_seconds + settings.WORKERS_SWEEP_SECONDS) * 1000)


def send(work, expires=True, request_id=''):
    """Publish the work's message on its queue, expiring at its queue deadline, with the time limits of the
    config in force, within the publish deadline (workers.publisher). By task name: the API never imports
    the tasks module, and so none of the workers' signal handlers.

    `expires=False` for a work that already started (sent again to take over from a worker that is gone):
    the queue deadline bounds the wait for a first start, and a worker discards a message past its
    `expires` unread, so a takeover after the deadline would never happen and the work would stay
    `running` on nobody. A work not started yet carries its worker leases (LEASES_HEADER): its worker
    renews them and claims the row in one statement, without reading it first (workers.execution.run).
    A work a request of this process waits for names this process's notice channel (notify.reply_to): its
    end is announced there only."""
    limits = time_limits(get_config())
    headers = {'request_id': request_id or None}
    to = notify.reply_to(work.pk)
    if to:
        headers[notify.NOTICE_HEADER] = to
    if expires:
        headers[LEASES_HEADER] = {key: work.lease[key] for key in LEASE_MESSAGE_KEYS if key in work.lease}
    publisher.publish(app.send_task, TASK_NAME, args=[work.pk], task_id=work.pk, queue=work.queue,
                      expires=work.expires_at if expires else None, priority=work.priority,
                      soft_time_limit=limits.soft, time_limit=limits.hard, headers=headers)


def enqueue(work, call, publish=None):
    """Insert `work` and its first call `call` (new, unsaved; the call's id is the work's) and publish the
    work's message, in one transaction.

    A publish that fails rolls both back and raises; an IntegrityError means another request with the same
    Idempotency-Key won the race (the caller answers with that call).
    """
    call.work, call.served_as = work, ServedAs.RUN
    with transaction.atomic():
        statements.insert(work, call)  # the call is also its usage record
        (publish or send)(work, request_id=call.request_id)
    counters.record_served(work.queue, ServedAs.RUN)
    return call


def join(call, work):
    """Insert `call` (new, unsaved) as one more handle on `work` while it is open: no lease, no message; it
    shows the work's state. None when the work ended meanwhile (nothing is written: the caller looks
    again). The work's row is updated first, under its row lock, so a cancel of its last other call waits
    for this one (workers.lifecycle.ending.cancel)."""
    call.work, call.served_as = work, ServedAs.COALESCED
    with transaction.atomic():
        if not Work.objects.filter(pk=work.pk, state__in=OPEN_STATES).update(holders=F('holders') + 1,
                                                                            shared=True):
            return None
        call.save(force_insert=True)  # an IntegrityError: another request with this Idempotency-Key won
    work.refresh_from_db()
    counters.record_served(work.queue, ServedAs.COALESCED)
    return call


def serve_cached(call, work):
    """Insert `call` (new, unsaved) as answered by the result of `work`, which succeeded: `succeeded` at
    once, counted and logged. Nothing of the lanes or the queue is touched."""
    call.work, call.served_as, call.created_at = work, ServedAs.CACHED, timezone.now()
    call.save(force_insert=True)
    counters.record_served(work.queue, ServedAs.CACHED)
    counters.record_end(work.queue, State.SUCCEEDED)
    log_line(call, work)
    return call
