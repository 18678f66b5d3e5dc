"""The sweep: every WORKERS_SWEEP_SECONDS (Celery beat, on the `maintenance` queue) it finds the work that
nothing else would end or run, and ends or sends it through workers.lifecycle:

1. a queued work past its queue deadline ends `expired` (its leases are released, its calls' lines logged
   and its message taken off the broker), even when nobody polls it and no worker sees its message;
2. a queued work older than WORKERS_SWEEP_GRACE_SECONDS whose message is on no broker list and not
   unacknowledged (a Redis that lost its data, a publish that never landed), or whose message a worker took
   more than that long ago without starting it (the worker lost it: a pool process that died with the job
   in its pipe, a broker connection cut between the read and the run; a message held for its ETA, a
   retry's countdown, counts from then), is published again with the same task id, while its deadline
   hasn't passed; the lost delivery's entry is taken off `unacked`, or kombu would deliver it once more
   after the visibility timeout;
3. a running work whose heartbeat is older than `lease_seconds` (its worker is gone: a live one beats every
   WORKERS_HEARTBEAT_SECONDS) is published again too, whether its message is nowhere on the broker or held
   unacknowledged by the dead node (that entry is taken off `unacked` first, so the broker never restores it
   an hour later): the next delivery, on a live node, takes over (lifecycle.start) within about
   `lease_seconds` + WORKERS_SWEEP_SECONDS of the node's death, not at the visibility timeout;
4. a cancelled work whose run was never confirmed stopped, not beaten for longer than `lease_seconds` and
   counted in no lane any more (its worker is gone: a live run renews its leases until it has stopped) is
   marked stopped, as its worker would have (lifecycle.stopped);
5. the leases of every work still queued are renewed (lifecycle.queued_lease_ms: `lease_seconds` plus one
   sweep), so a queued work stays counted however long it waits, and the leases of one whose API process
   died before its row was written come back by themselves within that time;
6. the message of a work that ended while queued and is still on a list (a cancel whose discard failed) is
   taken out, so a queue's depth counts only work that still waits; so is the unacknowledged entry of a
   work that ended, once it is older than the grace period (a worker lost that delivery: nothing would
   ever acknowledge it).

One sweep runs at a time across the cluster (a Redis lock that expires by itself). A message that appears
twice (a worker took it in the instant between the broker read and the republish) is a duplicate, which
lifecycle.start drops. Written by hand: kombu and Celery have no notion of a message that went missing.
"""
import logging
import time
import uuid
from dataclasses import dataclass, field

from django.conf import settings

from capacity.config import get_config
from common import connections
from workers import lanes, lifecycle, messages
from workers.models import State, Work

logger = logging.getLogger('heavy_lanes')
LOCK_KEY = 'sweep-lock'


@dataclass
class SweepReport:
    expired: list = field(default_factory=list)
    resent: list = field(default_factory=list)
    discarded: int = 0
    stopped: list = field(default_factory=list)  # cancelled work whose worker was gone
    renewed: int = 0  # queued works whose leases were renewed
    skipped: bool = False  # another sweep held the lock

    def to_json(self):
        return {'expired': len(self.expired), 'resent': len(self.resent), 'discarded': self.discarded,
                'stopped': len(self.stopped), 'renewed': self.renewed, 'skipped': self.skipped}


def lock(client, seconds):
    """Take the cluster-wide sweep lock for `seconds`; a token when taken, else None."""
    token = uuid.uuid4().hex
    key = f'{settings.CAPACITY_KEY_PREFIX}:{LOCK_KEY}'
    return token if client.set(key, token, nx=True, ex=max(int(seconds), 1)) else None


def unlock(client, token):
    key = f'{settings.CAPACITY_KEY_PREFIX}:{LOCK_KEY}'
    if client.get(key) in (token, token.encode()):
        client.delete(key)


def sweep(grace_seconds=None, broker=None):
    """Run one sweep (see the module docstring) and say what it did."""
    report = SweepReport()
    client = connections.connect('pools')
    token = lock(client, settings.WORKERS_SWEEP_SECONDS * 2)
    if token is None:
        report.skipped = True
        return report
    try:
        run_steps(report, settings.WORKERS_SWEEP_GRACE_SECONDS if grace_seconds is None else grace_seconds,
                  broker or messages.broker())
    finally:
        unlock(client, token)
    if report.expired or report.resent or report.discarded or report.stopped:
        logger.info('Sweep: %s', report.to_json())
    return report


def run_steps(report, grace_seconds, broker):
    for work in lifecycle.overdue():
        if lifecycle.end_unstarted(work.pk, State.EXPIRED, purge=True):
            report.expired.append(work.pk)
    stale_seconds = get_config().lease_seconds
    candidates = lifecycle.maybe_lost(grace_seconds, stale_seconds)
    found = messages.snapshot(lanes.QUEUE_NAMES, broker)
    held = {}
    for entry in found.held:
        held.setdefault(entry.call_id, []).append(entry)
    taken_before = time.time() - grace_seconds
    for work in candidates:
        if work.pk in found.waiting:
            continue
        if work.pk in held:
            entries = held[work.pk]
            if any(entry.due_at > taken_before for entry in entries):
                continue  # a worker has it (only just taken, or held until its ETA)
            if not sum(messages.drop_held(entry, broker) for entry in entries):
                continue  # acknowledged in the meantime: its worker ran it
            taken = time.time() - max(entry.taken_at for entry in entries)
            if work.state == State.QUEUED:
                logger.warning('Heavy work %s: a worker took its message %.0f s ago and never started it',
                               work.pk, taken)
            else:
                logger.warning('Heavy work %s: the node running it stopped beating (%s); its message, taken '
                               '%.0f s ago, is sent again for a live node to take over', work.pk, work.worker,
                               taken)
        if lifecycle.redeliver(work, stale_seconds):
            report.resent.append(work.pk)
    for work in lifecycle.stranded(stale_seconds):
        lease = lifecycle.worker_lease(work)  # what its worker renews; read only
        # An uncounted work (admitted while Redis was away) has no lease to tell a live run by: left alone.
        if lease.holding and lease.counted() is False and lifecycle.stopped(work.pk):
            logger.warning('Heavy work %s was cancelled while it ran on a worker that is gone: marked stopped',
                           work.pk)
            report.stopped.append(work.pk)
    report.renewed = renew_queued()
    report.discarded = discard_ended(found, taken_before, broker)


def renew_queued():
    """Renew the leases of every work still queued, to lifecycle.queued_lease_ms; how many were held."""
    lease_ms = lifecycle.queued_lease_ms()
    renewed = 0
    for work in lifecycle.queued():
        renewed += lifecycle.worker_lease(work, lease_ms).renew()
    return renewed


def discard_ended(found, taken_before, broker):
    """Take the waiting messages of work that already ended off the broker, and their unacknowledged
    entries taken before `taken_before`; return how many were removed."""
    ids = list(found.ids())
    removed = 0
    for start in range(0, len(ids), 500):
        ended = dict(Work.objects.filter(pk__in=ids[start:start + 500]).exclude(
            state__in=(State.QUEUED, State.RUNNING)).values_list('pk', 'queue'))
        for work_id, queue in ended.items():
            if work_id in found.waiting:
                removed += messages.discard(work_id, queue, broker)
        for entry in found.held:
            if entry.call_id in ended and entry.due_at <= taken_before:
                removed += messages.drop_held(entry, broker)
    return removed
