"""Handles that share one run of a work (workers.sharing decides when; this writes their rows).

A work is run by its leader, an ordinary call with its leases and its message. An identical call made
while it is open joins it (`join`): a follower row points at the leader (`leader`), holds no lease and has
no message, and follows the leader's state: `running` when the leader starts (`started`), and the leader's
end when it ends (`settle`, from `ended`). An identical call made after a leader succeeded, within
`cache.ttl_seconds`, is answered at once (`serve_cached`): a row `succeeded` from the start, pointing at
the call whose result it shows. A follower's or a cached handle's result is its leader's (`reads.result`).

Cancelling: a follower's owner cancels only that handle; a leader's owner, while followers are open,
detaches it (`detached_at`: the owner sees it cancelled, the work goes on for the others). The work itself
is cancelled with its last handle (ending.cancel).
"""
import logging

from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from capacity import counters, failopen
from capacity.config import get_config, time_limits
from capacity.keys import joined_key, warm_key, work_claim_key
from capacity.store import get_store
from workers import notify
from workers.lifecycle.reads import log_line
from workers.models import FINAL_STATES, OPEN_STATES, HeavyCall, ServedAs, State

logger = logging.getLogger('heavy_lanes')
CLAIM_SLACK_SECONDS = 30  # a work's claim outlives the longest its leader can stay open by this much


def claim_ms(config):
    """How long a work's claim (and its leader's joined mark) lives: past the longest its leader can stay
    open, queued then running."""
    return int((config.queue.deadline_seconds + time_limits(config).hard + CLAIM_SLACK_SECONDS) * 1000)


def join(call, leader):
    """Insert `call` (a new, unsaved row) as a follower of the open `leader`; return it, or None when the
    leader's work was cancelled while it joined (nothing is left behind: the caller starts over).

    The leader's joined mark is set first (`mark_joined`), then the row is written and the leader read
    again, so a leader that ends in between is seen either way: one whose end took the mark away after it
    was set looks for its followers and finds this one, or this handle finds it ended and ends as it did.
    """
    if not mark_joined(leader):
        return None  # the leader's end couldn't know of this handle: the caller runs its own work
    call.leader, call.served_as, call.work_key = leader, ServedAs.COALESCED, leader.work_key
    call.priority, call.expires_at = leader.priority, leader.expires_at
    call.state = State.RUNNING if leader.state == State.RUNNING else State.QUEUED
    call.started_at = leader.started_at if leader.state == State.RUNNING else None
    call.save(force_insert=True)  # an IntegrityError: another request with this Idempotency-Key won
    fresh = HeavyCall.objects.filter(pk=leader.pk).first()
    if fresh is None or fresh.state == State.CANCELLED:
        HeavyCall.objects.filter(pk=call.pk).delete()
        return None
    if fresh.state in FINAL_STATES:
        settle(fresh)
        call.refresh_from_db()
    elif fresh.state == State.RUNNING and call.state == State.QUEUED:  # it started as this one joined
        HeavyCall.objects.filter(pk=call.pk, state=State.QUEUED).update(state=State.RUNNING,
                                                                       started_at=fresh.started_at)
        call.refresh_from_db()
    counters.record_served(call.queue, ServedAs.COALESCED)
    return call


def serve_cached(call, source):
    """Insert `call` (a new, unsaved row) as answered by the result of `source`, a succeeded call of the
    same work: `succeeded` at once, counted and logged. Nothing of the lanes or the queue is touched."""
    now = timezone.now()
    call.leader, call.served_as, call.work_key = source, ServedAs.CACHED, source.work_key
    call.state, call.started_at, call.finished_at, call.expires_at = State.SUCCEEDED, now, now, now
    call.save(force_insert=True)
    counters.record_served(call.queue, ServedAs.CACHED)
    counters.record_end(call.queue, State.SUCCEEDED)
    log_line(call)
    return call


def started(leader):
    """The leader started running: so did its queued followers."""
    HeavyCall.objects.filter(leader_id=leader.pk, state=State.QUEUED).update(
        state=State.RUNNING, started_at=leader.started_at)


def settle(leader):
    """End the open followers of a leader that ended, the way it ended (its state, error and answer, and
    the usage given back when it failed); count, log and announce each. Returns their ids."""
    ids = list(HeavyCall.objects.filter(leader_id=leader.pk, state__in=OPEN_STATES).values_list('pk', flat=True))
    ended_ids = []
    for call_id in ids:  # one guarded UPDATE each: a follower cancelled meanwhile stays cancelled
        if HeavyCall.objects.filter(pk=call_id, state__in=OPEN_STATES).update(
                state=leader.state, finished_at=leader.finished_at, error=leader.error,
                error_status=leader.error_status, error_body=leader.error_body, refunded_at=leader.refunded_at,
                started_at=Coalesce(F('started_at'), leader.started_at)):
            ended_ids.append(call_id)
    for call in HeavyCall.objects.filter(pk__in=ended_ids):
        counters.record_end(call.queue, call.state)
        log_line(call)
        # A follower's result is its leader's (reads.result); announced with it when the leader's end was.
        notify.publish(call.pk, call.state, getattr(leader, 'work_result_text', None))
    return ended_ids


def mark_joined(leader):
    """Say in Redis that a call joins `leader`'s work (capacity.keys.joined_key), for as long as its claim
    can live; False when that couldn't be said (the caller then doesn't join)."""
    store = get_store()
    if not store.is_available():
        return False
    try:
        store.command('set', joined_key(leader.pk), 1, px=claim_ms(get_config()))
    except Exception as ex:  # noqa: BLE001 - fail open: the call runs its own work
        failopen.record(None, ex, 'sharing join', store)
        return False
    return True


def release_work(leader):
    """The leader ended: identical calls no longer join it; when it succeeded, its result answers them for
    `cache.ttl_seconds`. One script (capacity/lua/unclaim.lua), which also takes the leader's joined mark:
    returns True when a call joined it, False when none did, None when Redis couldn't say (its followers
    are then looked for in the database all the same). A failure only costs sharing, never the call (the
    claim expires by itself, and joiners treat a claim of an ended call as gone)."""
    if not leader.work_key:
        return None
    store = get_store()
    if not store.is_available():
        return None
    try:
        return store.end_work(*work_release(leader))
    except Exception as ex:  # noqa: BLE001
        return work_release_failed(ex, store)


def work_release(leader):
    """The arguments of the leader's work release (capacity.store.LaneStore.end_work)."""
    ttl = get_config().cache.ttl_seconds if leader.state == State.SUCCEEDED else 0
    return (work_claim_key(leader.work_key), leader.pk, warm_key(leader.work_key), int(ttl * 1000),
            joined_key(leader.pk))


def work_release_failed(ex, store):
    failopen.record(None, ex, 'work release', store)
    return None


def open_followers(leader_id):
    return HeavyCall.objects.filter(leader_id=leader_id, state__in=OPEN_STATES).exists()


def detach(call):
    """The owner of a leader cancels it while followers share its work: mark it detached (its owner sees
    it cancelled from now on); True when it was. Its row is counted once, by how its work ends."""
    now = timezone.now()
    if not HeavyCall.objects.filter(pk=call.pk, state__in=OPEN_STATES, detached_at__isnull=True).update(
            detached_at=now):
        return False
    call.detached_at = now
    notify.publish(call.pk, State.CANCELLED)
    return True


def unsettled(limit=500):
    """Leaders that ended with followers still open (the end's settling was cut short): the sweep settles
    them."""
    leader_ids = HeavyCall.objects.filter(state__in=OPEN_STATES, leader__state__in=FINAL_STATES).values_list(
        'leader_id', flat=True).distinct()[:limit]
    return list(HeavyCall.objects.filter(pk__in=list(leader_ids)))
