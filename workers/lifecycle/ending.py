"""Ending: a call cancelled by its owner (and its work with its last open call), a work that won't run or
won't run on (expired, revoked, stopped), and what follows every end of a work (`ended`)."""
import logging
from collections import Counter, defaultdict

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from capacity import counters
from capacity.admission import lease_from_message
from capacity.lease import release_and_end_all
from workers import messages, notify, sharing
from workers.celery import app
from workers.lifecycle.reads import log_line
from workers.lifecycle.transitions import move, move_all
from workers.models import OPEN_STATES, Call, ServedAs, State, Work

logger = logging.getLogger('heavy_lanes')


def worker_lease(work, lease_ms=None):
    """The leases `work`'s worker renews and releases (its first call's, without the API host's lane), as
    a capacity Lease; `lease_ms` defaults to 0 (a lease only released or read)."""
    return lease_from_message(work.lease or {'keys': [], 'token': work.pk, 'holding': False}, lease_ms or 0)


def cancel(call):
    """Cancel `call` for its owner; return the state its work was in (queued or running), or None when the
    call had ended for its owner already (its work ended, or it was cancelled before).

    The call is marked cancelled, its count and its log line written now; its work goes on while other
    open calls point at it, and is cancelled with the last one (`cancel_work`). Done under the work's row
    lock, so a call joining the work, a worker recording its end and another cancel all see either the
    work before this or after it.
    """
    now = timezone.now()
    with transaction.atomic():
        work = Work.objects.select_for_update().filter(pk=call.work_id).first()
        if work is None or work.state not in OPEN_STATES:
            return None
        was = work.state
        if was == State.RUNNING and work.started_at is not None and work.started_at > now:
            # Its start was written by another clock (the database's, a worker host's) or after this
            # request read its own: the owner sees a start before the cancel (seen), as it happened.
            now = work.started_at
        if not Call.objects.filter(pk=call.pk, cancelled_at__isnull=True).update(cancelled_at=now):
            return None
        last = work.holders <= 1
        if last:
            move('cancel', work.pk, finished_at=now, holders=0)
        else:
            Work.objects.filter(pk=work.pk).update(holders=F('holders') - 1)
    call.cancelled_at = now
    work.refresh_from_db()
    call.work = work
    counters.record_end(work.queue, State.CANCELLED)
    log_line(call, work)
    if last:
        cancel_work(work, was)
    else:
        notify.publish(work.pk, State.CANCELLED)  # a bare wake-up: this call's waiting requests look again
    return was


def cancel_work(work, was):
    """What follows the cancel of a work that was `was` (queued or running): a queued one never runs (a
    worker's `start` finds it cancelled), so its leases go back and its message comes off the broker now;
    a running one is stopped where it runs (Celery's revoke with terminate, and its heartbeat as the
    backstop), and its worker releases its leases once it has stopped (`stopped`)."""
    if was == State.QUEUED:
        lease = worker_lease(work)
        lease.release()
        note_limiter(work, lease)
        discard_message(work)
    notify.publish(work.pk, State.CANCELLED)
    sharing.release_work(work)  # identical calls start afresh instead of joining it
    try:
        app.control.revoke(work.pk, terminate=(was == State.RUNNING), signal='SIGTERM')
    except Exception:  # noqa: BLE001 - the row says cancelled; a worker checks it before and while running
        logger.warning('Revoke of cancelled work %s not sent; its worker finds the row cancelled', work.pk)


def cancel_all(calls):
    """`cancel` for many calls at once (a client's run): {call id: the state its work was in} for the calls
    it cancelled, each as `cancel` would, in one transaction of a few set-based statements under the works'
    row locks, then one round trip for the leases, notices and claims of the works it cancelled, one pass
    over each queue's messages and one revoke for all of them. A call whose work had ended, or that was
    cancelled already, is left out. `calls` come with their work (select_related) or not: it is read anew.
    """
    by_work = defaultdict(list)
    for call in calls:
        by_work[call.work_id].append(call)
    if not by_work:
        return {}
    now = timezone.now()
    with transaction.atomic():
        works = {work.pk: work for work in Work.objects.select_for_update().filter(
            pk__in=list(by_work), state__in=OPEN_STATES).order_by('pk')}
        open_ids = set(Call.objects.filter(pk__in=[call.pk for work_id in works for call in by_work[work_id]],
                                           cancelled_at__isnull=True).values_list('pk', flat=True))
        was, at, letting_go = {}, {}, Counter()
        for work_id, work in works.items():
            mine = [call for call in by_work[work_id] if call.pk in open_ids]
            if not mine:
                continue
            # As `cancel`: a start another clock wrote later than this request's now is shown before the cancel.
            at[work_id] = work.started_at if (work.state == State.RUNNING and work.started_at is not None
                                              and work.started_at > now) else now
            letting_go[work_id] = len(mine)
            for call in mine:
                was[call.pk] = work.state
        by_time = defaultdict(list)
        for work_id, moment in at.items():
            by_time[moment].append(work_id)
        for moment, work_ids in by_time.items():
            Call.objects.filter(pk__in=[call.pk for work_id in work_ids for call in by_work[work_id]
                                        if call.pk in was], cancelled_at__isnull=True).update(cancelled_at=moment)
        last = [work_id for work_id, count in letting_go.items() if works[work_id].holders <= count]
        for moment, work_ids in by_time.items():
            move_all('cancel', [work_id for work_id in work_ids if work_id in last], finished_at=moment, holders=0)
        staying = defaultdict(list)
        for work_id, count in letting_go.items():
            if work_id not in last:
                staying[count].append(work_id)
        for count, work_ids in staying.items():
            Work.objects.filter(pk__in=work_ids).update(holders=F('holders') - count)
    fresh = Work.objects.in_bulk(list(letting_go))
    ended_on = Counter()
    for work_id in letting_go:
        for call in by_work[work_id]:
            if call.pk in was:
                call.cancelled_at, call.work = at[work_id], fresh[work_id]
                ended_on[fresh[work_id].queue] += 1
                log_line(call, fresh[work_id])
    for queue, count in ended_on.items():
        counters.record_end(queue, State.CANCELLED, count)
    cancel_works([(fresh[work_id], works[work_id].state) for work_id in last])
    for work_id in letting_go:
        if work_id not in last:
            notify.publish(work_id, State.CANCELLED)  # a bare wake-up, as `cancel`
    return was


def cancel_works(works):
    """`cancel_work` for many (work, was) pairs: the queued ones' leases, notices and claims in one round
    trip for all (capacity.lease.release_and_end_all), the queues' messages in one pass per queue, one revoke
    for the queued ones and one for the running ones."""
    queued, ends = defaultdict(list), []
    for work, was in works:
        if was == State.QUEUED:
            ends.append((work, worker_lease(work), notify.notice(work.pk, State.CANCELLED),
                         sharing.work_release(work)))
            queued[work.queue].append(work.pk)
        else:
            notify.publish(work.pk, State.CANCELLED)
            sharing.release_work(work)
    sent = release_and_end_all([(lease, notice, release) for _, lease, notice, release in ends])
    for (work, lease, _, _), published in zip(ends, sent):
        if not published:
            notify.publish(work.pk, State.CANCELLED)
            sharing.release_work(work)
        note_limiter(work, lease)
    for queue, work_ids in queued.items():
        try:
            messages.discard_all(work_ids, queue)
        except Exception as ex:  # noqa: BLE001 - the rows say cancelled; a worker that gets a message skips it
            logger.warning('Messages of %d cancelled works left on %s (%s: %s); the sweep takes them out',
                           len(work_ids), queue, type(ex).__name__, ex)
    for terminate, ids in ((False, [work.pk for work, was in works if was == State.QUEUED]),
                           (True, [work.pk for work, was in works if was == State.RUNNING])):
        if not ids:
            continue
        try:
            app.control.revoke(ids, terminate=terminate, signal='SIGTERM')
        except Exception:  # noqa: BLE001 - the rows say cancelled; a worker checks them before and while running
            logger.warning('Revoke of %d cancelled works not sent; their workers find the rows cancelled', len(ids))


def taken_over(work, worker):
    """Whether another delivery runs `work` now (this worker was presumed gone): it holds the leases."""
    return Work.objects.filter(pk=work.pk, state=State.RUNNING).exclude(worker=worker).exists()


def stopped(work_id, lease=None):
    """A cancelled work's run has stopped (the process that ran it is gone, or its run stopped it): mark
    that no worker runs it and release its leases (`lease`, the worker's, or the ones its row names), once:
    the worker's main process and the run itself may both say so. False when it wasn't still running."""
    if not Work.objects.filter(pk=work_id, state=State.CANCELLED, heartbeat_at__isnull=False).update(
            heartbeat_at=None):
        return False
    work = Work.objects.get(pk=work_id)
    lease = lease or worker_lease(work)
    lease.release()
    note_limiter(work, lease)
    return True


def wait_stopped(call, seconds):
    """Wait up to `seconds` until no worker runs `call`'s work any more, if it was cancelled with this call
    (else the work goes on for others, and there is nothing to wait for); True when that happened."""
    work = call.work

    def stopped_now():
        work.refresh_from_db(fields=['state', 'heartbeat_at', 'finished_at'])
        return work.state != State.CANCELLED or work.heartbeat_at is None
    return notify.wait_for(work.pk, stopped_now, seconds)


def end_unstarted(work_id, state, purge=False):
    """End a work that won't run (`expired` past its deadline, `cancelled` when its message was revoked
    before it ran): mark it if it is still queued, release its leases, end it. Idempotent. A work that runs
    (a message of it expired or was revoked while another delivery runs it) is left alone, leases and all.
    `purge`: its message may still wait on the broker (no worker took it): take it out, so the queue's
    depth counts only work that still waits."""
    ended_now = move('expire' if state == State.EXPIRED else 'revoke', work_id, finished_at=timezone.now())
    work = Work.objects.filter(pk=work_id).first()
    if work is None or work.state == State.RUNNING:
        return False
    lease = worker_lease(work)
    lease.release()
    if ended_now:
        ended(work, lease)
    if purge:
        discard_message(work)
    return bool(ended_now)


def expire(work):
    """A queued work past its deadline is expired, even before a worker sees its message (which is taken
    off the broker); returns `work`, fresh."""
    if work.state == State.QUEUED and timezone.now() >= work.expires_at:
        end_unstarted(work.pk, State.EXPIRED, purge=True)
        work.refresh_from_db()
    return work


def discard_message(work):
    """Take a work that will never run off its queue's broker lists; best effort (the sweep retries)."""
    try:
        messages.discard(work.pk, work.queue)
    except Exception as ex:  # noqa: BLE001 - the row says it ended; a worker that gets the message skips it
        logger.warning('Message of ended work %s left on the broker (%s: %s); the sweep takes it out',
                       work.pk, type(ex).__name__, ex)


def open_calls(work, first=None):
    """The calls `work` ends for: those not cancelled, and not answered from its result after it ended
    (a warm result ends at once). `first`: its first call, already read (an unshared work has no other)."""
    if not work.shared:
        if first is None:
            first = Call.objects.filter(pk=work.pk).first()
        return [first] if first is not None and first.cancelled_at is None else []
    return list(Call.objects.filter(work=work, cancelled_at__isnull=True).exclude(served_as=ServedAs.CACHED))


def ended(work, lease=None, result_text=None, first=None, sent=False):
    """What follows any end of `work`: each of its open calls counted and logged once; its completion
    notice (with the result's JSON text when it succeeded and no other call shares it: its one waiting
    owner then answers from the notice alone); identical calls stop joining it, and are answered from its
    result while it is warm. `sent`: end_with_release sent the notice and the work's release already."""
    calls = open_calls(work, first)
    if calls:
        counters.record_end(work.queue, work.state, len(calls))
    for call in calls:
        call.work = work
        log_line(call, work, lease)
    if not sent:
        notify.publish(work.pk, work.state, notice_result(work, result_text), work.answer_count)  # every process
        sharing.release_work(work)


def notice_result(work, result_text):
    """What a work's end announces with its state: the result's text, only for a work that succeeded and
    that no other call shares (a shared work's calls may have been cancelled since: each reads its own)."""
    return result_text if work.state == State.SUCCEEDED and not work.shared else None


def notice_to(work):
    """The channel of the one API process that waits for `work` (its message named it: notify.reply_to),
    when no other call joined it; None: its end goes to every process."""
    return None if work.shared else work.notice_to


def end_with_release(work, lease, ran=None, result_text=None, first=None):
    """`ended` for a run its worker recorded, whose leases go back now: the release, the completion notice
    and the work's release go to Redis in one round trip (capacity.lease.Lease.release_and_end: the pool
    process's next call waits behind every round trip of this one's end). A notice for one process that
    no process heard (it is gone) goes to every process after all: a long poll elsewhere hears it."""
    to = notice_to(work)
    published = lease.release_and_end(ran=ran, notice=notify.notice(
        work.pk, work.state, notice_result(work, result_text), work.answer_count, to=to),
        work=sharing.work_release(work))
    note_limiter(work, lease)
    if published and to and lease.heard == 0:
        notify.publish(work.pk, work.state)
    if not published:
        notify.publish(work.pk, work.state, notice_result(work, result_text), work.answer_count)
        sharing.release_work(work)
    ended(work, lease, result_text, first, sent=True)


def note_limiter(work, lease):
    """Keep what the limiter met while the work ran (a lost lease, an error) for its calls' log lines."""
    if lease.lease_lost or lease.error:
        work.lease_lost, work.limiter_error = lease.lease_lost, (lease.error or '')[:300]
        Work.objects.filter(pk=work.pk).update(lease_lost=work.lease_lost, limiter_error=work.limiter_error)
