"""Ending a call that won't run, or won't run on: cancel, expiry, a stopped or revoked call, and what
follows every end (`ended`)."""
import logging
from dataclasses import replace

from django.utils import timezone

from capacity import counters
from workers import messages, notify
from workers.celery import app
from workers.lifecycle import sharing
from workers.lifecycle.reads import admission_of, log_line
from workers.models import FINAL_STATES, OPEN_STATES, HeavyCall, State

logger = logging.getLogger('heavy_lanes')


def cancel(call):
    """Cancel a queued or running call for its owner; return the state it was cancelled from, or None if
    it had ended (for its owner: a detached call has).

    A handle that shares its work with others (workers.lifecycle.sharing) only lets go of it: a follower is
    cancelled alone, a leader with open followers is detached. The work is cancelled with its last handle.
    """
    if call.detached_at is not None:
        return None
    if call.leader_id is not None:
        return cancel_follower(call)
    if sharing.open_followers(call.pk):
        was = call.state
        if sharing.detach(call):
            if not sharing.open_followers(call.pk):  # its followers ended meanwhile: so does the work
                cancel_work(call)
            return was
        call.refresh_from_db()  # it ended, or was detached, meanwhile
        return None if call.finished else cancel_work(call)
    return cancel_work(call)


def cancel_follower(call):
    """Cancel one follower; when its leader is detached and this was its last open follower, the work."""
    now = timezone.now()
    was = call.state
    if not HeavyCall.objects.filter(pk=call.pk, state__in=OPEN_STATES).update(state=State.CANCELLED,
                                                                            finished_at=now):
        call.refresh_from_db()
        return None
    call.refresh_from_db()
    ended(call)
    leader = HeavyCall.objects.filter(pk=call.leader_id).first()
    if leader is not None and leader.detached_at is not None and not sharing.open_followers(leader.pk):
        cancel_work(leader)
    return was


def cancel_work(call):
    """Cancel the work of a queued or running call; return the state it was cancelled from, or None.

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
    """A cancelled call's work has stopped (the process that ran it is gone, or its run stopped it): mark
    that no worker runs it, release its leases (`lease`, the worker's, or the admission's) and log it, once:
    the worker's main process and the run itself may both say so. False when it wasn't still running."""
    if not HeavyCall.objects.filter(pk=call_id, state=State.CANCELLED, heartbeat_at__isnull=False).update(
            heartbeat_at=None):
        return False
    call = HeavyCall.objects.filter(pk=call_id).first()
    lease = lease or admission_of(call).lease()
    lease.release()
    ended(call, lease, count=False)  # counted when it was cancelled
    return True


def wait_stopped(call, seconds):
    """Wait up to `seconds` until no worker runs `call` any more (it ended, or it was cancelled and its work
    has stopped); True when that happened. For a handle that shared its work: until the work stopped, if it
    was cancelled with this handle."""
    if call.leader_id is not None or call.detached_at is not None:
        work = call.leader if call.leader_id is not None else call
        work.refresh_from_db(fields=['state', 'heartbeat_at', 'finished_at', 'detached_at'])
        if work.state != State.CANCELLED:
            return True  # the work goes on for the others
        call = work

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
    off the broker). A follower's deadline is its leader's: the leader expires, and its followers with it."""
    if call.state == State.QUEUED and timezone.now() >= call.expires_at:
        end_unstarted(call.leader_id or call.pk, State.EXPIRED, purge=True)
        call.refresh_from_db()
    return call


def discard_message(call):
    """Take a call that will never run off its queue's broker lists; best effort (the sweep retries)."""
    try:
        messages.discard(call.pk, call.queue)
    except Exception as ex:  # noqa: BLE001 - the row says it ended; a worker that gets the message skips it
        logger.warning('Message of ended call %s left on the broker (%s: %s); the sweep takes it out',
                       call.pk, type(ex).__name__, ex)


def ended(call, lease=None, count=True, sent=None):
    """What follows any end: the counter (once per call: `count`), the log line and the completion notice;
    for the leader of a work, identical calls stop joining it (and are answered from its result, when it
    succeeded), then its followers end the same way: looked for only when one joined it (its joined mark),
    which saves the end of every call that had none a query. A success whose result `succeed` kept
    (`result_text`) is announced with it, to the call's and its followers' waiting requests. `sent`: what
    `end_with_release` sent already (capacity.lease.Sent)."""
    if count:
        counters.record_end(call.queue, call.state)
    log_line(call, lease)
    if sent is None or not sent.published:
        notify.publish(call.pk, call.state, getattr(call, 'result_text', None))
    if not leads(call):
        return
    joined = sharing.release_work(call) if sent is None else sent.joined
    if joined is not False:
        sharing.settle(call)  # a call joined it, or Redis couldn't say: end its open followers


def leads(call):
    """Whether the call is the leader of a work (identical calls may join it)."""
    return call.leader_id is None and bool(call.work_key)


def end_with_release(call, lease, ran=None):
    """`ended` for a run its worker recorded, whose leases go back now: the release, the completion notice
    and a leader's work release go to Redis in one round trip (capacity.lease.Lease.release_and_end: the
    pool process's next call waits behind every round trip of this one's end)."""
    sent = lease.release_and_end(ran=ran, notice=notify.notice(call.pk, call.state, getattr(call, 'result_text', None)),
                                 work=sharing.work_release(call) if leads(call) else None)
    if isinstance(sent.joined, Exception):
        sent = replace(sent, joined=sharing.work_release_failed(sent.joined, lease.store))
    note_limiter(call, lease)
    ended(call, lease, sent=sent)


def note_limiter(call, lease):
    """Keep what the limiter met while the call ran (a lost lease, an error) for its log line."""
    if lease.lease_lost or lease.error:
        call.lease_lost, call.limiter_error = lease.lease_lost, (lease.error or '')[:300]
        HeavyCall.objects.filter(pk=call.pk).update(lease_lost=call.lease_lost, limiter_error=call.limiter_error)
