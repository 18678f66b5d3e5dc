"""The sweep's and retention's transitions (workers.sweep, workers.retention): find the calls nothing
else would end or run, publish again a message that was lost, find cancelled calls whose worker is gone,
delete old calls with their results."""
import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from workers.lifecycle.create import send
from workers.models import FINAL_STATES, HeavyCall, State

logger = logging.getLogger('heavy_lanes')


def overdue(now=None, limit=500):
    """Queued calls whose queue deadline passed (they will never run), oldest deadline first. Followers
    are not among them: they end with their leader."""
    now = now or timezone.now()
    overdue_calls = HeavyCall.objects.filter(state=State.QUEUED, expires_at__lte=now, leader__isnull=True).order_by(
        'expires_at')
    return list(overdue_calls[:limit])


def maybe_lost(grace_seconds, stale_seconds, now=None, limit=500):
    """Calls that may have lost their message: queued for more than `grace_seconds` and before their
    deadline, or running with a heartbeat older than `stale_seconds` (their worker is gone). Followers have
    no message of their own."""
    now = now or timezone.now()
    queued = Q(state=State.QUEUED, created_at__lt=now - timedelta(seconds=grace_seconds), expires_at__gt=now)
    stale = Q(state=State.RUNNING) & (Q(heartbeat_at__isnull=True) |
                                      Q(heartbeat_at__lt=now - timedelta(seconds=stale_seconds)))
    return list(HeavyCall.objects.filter(queued | stale, leader__isnull=True).order_by('created_at')[:limit])


def stranded(stale_seconds, now=None, limit=500):
    """Cancelled calls whose work was never confirmed stopped (`heartbeat_at` still set) and not beaten
    for more than `stale_seconds`: their worker may be gone with them (a node killed while the call ran,
    before or after the cancel), so nothing would ever say they stopped. A worker stops beating a call
    once it is cancelled, so the caller also asks the lanes (workers.sweep): a live run renews its
    leases until its work has stopped."""
    now = now or timezone.now()
    return list(HeavyCall.objects.filter(state=State.CANCELLED, heartbeat_at__lt=now - timedelta(
        seconds=stale_seconds)).order_by('heartbeat_at')[:limit])


def redeliver(call, stale_seconds, now=None):
    """Publish again the message of a call that lost it (same task id): a queued call before its
    deadline, or a running one whose worker is gone (the next delivery takes over, see `start`). Reads the
    row again first; returns whether it was sent. A message found later as well is a duplicate, which
    `start` drops."""
    now = now or timezone.now()
    fresh = HeavyCall.objects.filter(pk=call.pk).first()
    if fresh is None:
        return False
    if fresh.state == State.QUEUED:
        if now >= fresh.expires_at:
            return False
    elif fresh.state != State.RUNNING or (fresh.heartbeat_at is not None and
                                          fresh.heartbeat_at >= now - timedelta(seconds=stale_seconds)):
        return False
    send(fresh, expires=fresh.state == State.QUEUED)
    logger.warning('Heavy call %s (%s) had no message on the broker; published it again', fresh.pk,
                   fresh.state)
    return True


def forget_finished(before, limit=500):
    """Delete up to `limit` calls that ended before `before`, with their stored results, in one
    transaction (a call is never left without its result, nor a result without its call); return how many
    calls were deleted. A call whose result other handles show (workers.lifecycle.sharing) is kept until
    they are old enough too."""
    from django_celery_results.models import TaskResult
    young_handles = HeavyCall.objects.filter(leader_id=OuterRef('pk')).filter(
        Q(finished_at__isnull=True) | Q(finished_at__gte=before))
    with transaction.atomic():
        ids = list(HeavyCall.objects.filter(state__in=FINAL_STATES, finished_at__lt=before)
                   .exclude(Exists(young_handles))
                   .order_by('finished_at').values_list('pk', flat=True)[:limit])
        if ids:
            TaskResult.objects.filter(task_id__in=ids).delete()
            HeavyCall.objects.filter(pk__in=ids).delete()
    return len(ids)
