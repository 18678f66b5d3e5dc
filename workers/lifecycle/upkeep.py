"""The sweep's and retention's reads and transitions (workers.sweep, workers.retention): find the work nothing
else would end or run, publish again a message that was lost, find cancelled work whose worker is gone,
delete old work with its calls and results."""
import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import DateTimeField, Exists, ExpressionWrapper, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from workers.lifecycle.create import send
from workers.models import FINAL_STATES, Call, State, Work

logger = logging.getLogger('heavy_lanes')


def overdue(now=None, limit=500):
    """Queued work whose queue deadline passed (it will never run), oldest deadline first."""
    now = now or timezone.now()
    return list(Work.objects.filter(state=State.QUEUED, expires_at__lte=now).order_by('expires_at')[:limit])


def queued(limit=5000):
    """Work still waiting in its queue, before its deadline (the sweep renews their leases)."""
    return list(Work.objects.filter(state=State.QUEUED, expires_at__gt=timezone.now()).order_by('created_at')[:limit])


def maybe_lost(grace_seconds, stale_seconds, now=None, limit=500):
    """Work that may have lost its message: queued for more than `grace_seconds` and before its deadline,
    or running with a heartbeat older than `stale_seconds` by the database's clock, which wrote it (its
    worker is gone, whatever the clocks of the hosts say)."""
    now = now or timezone.now()
    queued_ = Q(state=State.QUEUED, created_at__lt=now - timedelta(seconds=grace_seconds), expires_at__gt=now)
    stale = Q(state=State.RUNNING) & (Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=ago(stale_seconds)))
    return list(Work.objects.filter(queued_ | stale).order_by('created_at')[:limit])


def ago(seconds):
    """The database's clock, `seconds` ago: heartbeats are written with it (lifecycle.running.beat)."""
    return ExpressionWrapper(Now() - timedelta(seconds=seconds), output_field=DateTimeField())


def stranded(stale_seconds, limit=500):
    """Cancelled work whose run was never confirmed stopped (`heartbeat_at` still set) and not beaten for
    more than `stale_seconds`: its worker may be gone with it (a node killed while it ran, before or after
    the cancel), so nothing would ever say it stopped. A worker stops beating a work once it is cancelled,
    so the caller also asks the lanes (workers.sweep): a live run renews its leases until it has stopped."""
    return list(Work.objects.filter(state=State.CANCELLED, heartbeat_at__lt=ago(stale_seconds)).order_by(
        'heartbeat_at')[:limit])


def redeliver(work, stale_seconds, now=None):
    """Publish again the message of a work that lost it (same task id): a queued work before its deadline,
    or a running one whose worker is gone (the next delivery takes over: lifecycle.running.start). Reads
    the row again first; returns whether it was sent. A message found later as well is a duplicate, which
    `start` drops."""
    now = now or timezone.now()
    fresh = Work.objects.filter(pk=work.pk).first()
    if fresh is None:
        return False
    if fresh.state == State.QUEUED:
        if now >= fresh.expires_at:
            return False
    elif fresh.state != State.RUNNING or Work.objects.filter(
            pk=fresh.pk, heartbeat_at__gte=ago(stale_seconds)).exists():
        return False  # its worker beat since: alive
    first = Call.objects.filter(pk=fresh.pk).values_list('request_id', flat=True).first()
    send(fresh, expires=fresh.state == State.QUEUED, request_id=first or '')
    logger.warning('Heavy work %s (%s) had no message on the broker; published it again', fresh.pk, fresh.state)
    return True


def forget_finished(before, limit=500):
    """Delete up to `limit` works that ended before `before`, with their calls and stored results, in one
    transaction (a call is never left without its work nor a work without its result); return how many
    works were deleted. A work whose result a younger call shows (a warm result answered it later) is kept
    until that call is old enough too."""
    from django_celery_results.models import TaskResult
    young_calls = Call.objects.filter(work_id=OuterRef('pk'), created_at__gte=before)
    with transaction.atomic():
        ids = list(Work.objects.filter(state__in=FINAL_STATES, finished_at__lt=before)
                   .exclude(Exists(young_calls))
                   .order_by('finished_at').values_list('pk', flat=True)[:limit])
        if ids:
            TaskResult.objects.filter(task_id__in=ids).delete()
            Work.objects.filter(pk__in=ids).delete()  # its calls go with it (on_delete=CASCADE)
    return len(ids)
