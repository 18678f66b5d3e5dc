"""Cluster-wide event counters kept in Redis, so /metrics is right however many API and worker
processes there are: decisions by queue, tier and decision; each full lane of a refused or
shadow-refused call; renewals that failed; calls by how they were served (run, coalesced,
cached: workers.sharing); calls that ended, by queue and final state (counted once, at
the transition that ends them, so the count neither costs a scan of the calls' table nor drops when
retention deletes old rows). One hash under the lane prefix; increments gather in the
process and reach Redis on the lane store's Redis thread, and never delay or fail a call.
"""
import threading
from collections import Counter

from capacity.store import get_store
from common.process import PerProcess

SEPARATOR = '|'


class Pending:
    """Increments gathered in this process and not yet sent."""

    def __init__(self):
        self.counts = Counter()  # field -> increments
        self.lock = threading.Lock()
        self.flush_queued = False


_pending = PerProcess(Pending)


def increment(*fields):
    """Add 1 to each field (a tuple of labels), without making the caller wait for Redis.

    Increments gather in this process and one job at a time takes them to Redis on the lane store's Redis
    thread (LaneStore.add_counts_later), so counters never hold more than one of its few queue places (the
    calls' own operations need them). A counter never costs a call anything: when they can't be sent (the
    skip window, a busy thread, an error) they are dropped.
    """
    if not fields:
        return
    pending = _pending.get()
    with pending.lock:
        for labels in fields:
            pending.counts[SEPARATOR.join(str(label) for label in labels)] += 1
        if pending.flush_queued:
            return
        pending.flush_queued = True
    if not get_store().add_counts_later(lambda: _take(pending)):
        _take(pending)  # not queued: these are dropped, and the next increment queues a job again


def _take(pending):
    """The gathered increments, now gone from `pending` (on the Redis thread, or when dropped)."""
    with pending.lock:
        counts = dict(pending.counts)
        pending.counts.clear()
        pending.flush_queued = False
    return counts


def read():
    """{(kind, *labels): count} for every counter; {} when Redis can't say."""
    raw = get_store().counters()
    return {tuple(name.split(SEPARATOR)): count for name, count in (raw or {}).items()}


def record_decision(admission, queue):
    """Count one gated call: its decision, and each lane it found full."""
    if admission is None or admission.decision is None:
        return
    tier = admission.tier or 'unknown'
    fields = [('decision', queue, tier, admission.decision)]
    fields += [('full', lane, tier, admission.decision) for lane in admission.full]
    increment(*fields)


def record_served(queue, served_as):
    """Count one call by how it was served: `run` (its own work), `coalesced` (joined an identical call's
    work), `cached` (answered from an identical call's stored result)."""
    increment(('served', queue, str(served_as)))


def record_end(queue, state, count=1):
    """Count `count` calls that ended (succeeded, failed, cancelled, expired) on `queue`."""
    increment(*[('finished', queue, str(state))] * count)
