"""Retention: finished work, its calls and its result are deleted together once it ended more than
HEAVY_LANES_RETENTION_SECONDS ago (default 7 days), by a periodic task (Celery beat, the `maintenance`
queue, every HEAVY_LANES_RETENTION_RUN_SECONDS).

What is kept, and for how long (docs/operations.md publishes it, as the Idempotency-Key draft asks): a
work's row (its payload, state, timings), its calls' rows (usage, Idempotency-Key) and its stored result
live until the retention period after the work ended, or after its youngest call was made (a warm result
answers calls after its work ended); open work is never deleted. After that, a poll of the call is a
404 and its Idempotency-Key may be used again for a new call. Counters in /metrics don't count rows, so
they don't drop when rows go. Deletes run in batches, each one transaction (lifecycle.forget_finished), so a
call is never left without its result nor a result without its call.

A Django setting, not a capacity config key: it is a data-keeping policy that is published to clients and
set per deployment, not a load knob staff turn at run time.
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from workers import lifecycle

logger = logging.getLogger('heavy_lanes')
BATCH = 500


def cutoff(now=None):
    """Calls that ended before this are deleted."""
    return (now or timezone.now()) - timedelta(seconds=settings.HEAVY_LANES_RETENTION_SECONDS)


def prune(now=None, batch=BATCH, max_batches=1000):
    """Delete every work (with its calls and result) that ended before the cutoff; return how many works
    were deleted."""
    before = cutoff(now)
    deleted = 0
    for _ in range(max_batches):
        count = lifecycle.forget_finished(before, batch)
        deleted += count
        if count < batch:
            break
    if deleted:
        logger.info('Retention: deleted %s works that ended before %s, with their calls and results', deleted,
                    before.isoformat())
    return deleted
