"""An owner's calls, listed by what the owner sees of them, and a client's run cancelled at once.

    calls = listed(owner=user, states=['failed'], endpoint='$match', run='r-42')  # newest first
    count = cancel_run(user, 'r-42')   # every open call of that run of `user`, through lifecycle.cancel_all

A call's visible state is not a column: it derives from the call and its work (workers.lifecycle.seen). The
filter by state is that function written as a query (`state_filter`), so a page of a filtered list holds only
calls whose bodies show that state. A run is the `automatch_run_id` its client sent in X-OCL-Event-Metadata
(stored whole as `Call.run_id`), found by exactly that id (`of_run`).
"""
import time
from dataclasses import dataclass

from django.db.models import Q
from django.utils import timezone

from workers import lifecycle
from workers.models import OPEN_STATES, Call, ServedAs, State

RETRYABLE = (State.FAILED, State.EXPIRED, State.CANCELLED)  # what POST /tasks/<id>/retry/ sends again
LEGACY_RUN_CHARS = 20  # what calls stored before migration 0014 kept of a run id (Call.run_id_cut)


def of_run(run):
    """The calls of the run its client names `run`: those stored with that id, and those stored with its
    first 20 characters when the API kept no more (`run_id_cut`)."""
    calls = Q(run_id=run)
    if len(run) > LEGACY_RUN_CHARS:
        calls |= Q(run_id=run[:LEGACY_RUN_CHARS], run_id_cut=True)
    return calls


def state_filter(state, now=None):
    """The calls whose owner sees `state` (lifecycle.seen, as a query on a call and its work). A queued work
    past its queue deadline is `expired` (lifecycle.expire ends it so as soon as anyone reads it)."""
    kept = Q(cancelled_at__isnull=True)
    cached = Q(served_as=ServedAs.CACHED)
    late = Q(work__state=State.QUEUED, work__expires_at__lte=now or timezone.now())
    if state == State.CANCELLED:
        return ~kept | (kept & ~cached & Q(work__state=State.CANCELLED))
    if state == State.SUCCEEDED:
        return kept & (cached | Q(work__state=State.SUCCEEDED))
    if state == State.QUEUED:
        return kept & ~cached & Q(work__state=State.QUEUED) & ~late
    if state == State.EXPIRED:
        return kept & ~cached & (Q(work__state=State.EXPIRED) | late)
    return kept & ~cached & Q(work__state=state)


def listed(owner=None, states=(), endpoint=None, run=None):
    """Calls newest first, with their work: `owner`'s (None: everyone's), in any of `states`, of `endpoint`,
    of the client's `run`. Each filter left empty doesn't apply."""
    calls = Call.objects.select_related('work')
    if owner is not None:
        calls = calls.filter(owner=owner)
    if states:
        either, now = Q(), timezone.now()
        for state in states:
            either |= state_filter(state, now)
        calls = calls.filter(either)
    if endpoint:
        calls = calls.filter(endpoint=endpoint)
    if run:
        calls = calls.filter(of_run(run))
    return calls.order_by('-created_at', '-id')


def open_calls_of_run(owner, run):
    """The calls of `owner`'s `run` that are open for the owner (queued or running), oldest first."""
    return listed(owner, states=OPEN_STATES, run=run).order_by('created_at', 'id')


@dataclass(frozen=True)
class Cancelled:
    """What cancelling a run did: how many calls it cancelled, and how many of those had work still running
    a moment later (their workers stop them at their next heartbeat at the latest)."""

    count: int
    still_running: int = 0


CANCEL_BATCH = 500  # calls cancelled in one transaction (lifecycle.cancel_all) while a run is cancelled


def cancel_run(owner, run, wait_seconds=0.0):
    """Cancel every open call of `owner`'s `run` as DELETE /tasks/<id>/ cancels one (a queued work's leases
    go back and its message comes off the queue, a running one is stopped where it runs and its worker
    releases its leases; a work that other calls share goes on for them), CANCEL_BATCH calls at a time
    through lifecycle.cancel_all: a few statements and one revoke a batch, not a transaction and a revoke a
    call. Then wait up to `wait_seconds` in all for the running ones to stop. A call that ended meanwhile
    is left as it ended; a call the run gets after the open ones were read is not cancelled."""
    ids = list(open_calls_of_run(owner, run).values_list('pk', flat=True))
    cancelled, running = 0, []
    for start in range(0, len(ids), CANCEL_BATCH):
        batch = list(Call.objects.select_related('work').filter(pk__in=ids[start:start + CANCEL_BATCH]))
        was = lifecycle.cancel_all(batch)
        cancelled += len(was)
        running += [call for call in batch if was.get(call.pk) == State.RUNNING]
    deadline = time.monotonic() + wait_seconds
    still = 0
    for call in running:
        if not lifecycle.wait_stopped(call, max(deadline - time.monotonic(), 0)):
            still += 1
    return Cancelled(cancelled, still)
