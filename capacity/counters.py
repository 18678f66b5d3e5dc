"""Cluster-wide event counters kept in Redis, so /metrics is right however many API and worker
processes there are: decisions by queue, tier and decision; each full lane of a refused or
shadow-refused call; renewals that failed; calls by how they were served (run, coalesced,
cached: workers.sharing); calls that ended, by queue and final state (counted once, at
the transition that ends them, so the count neither costs a scan of the calls' table nor drops when
retention deletes old rows). One hash under the lane prefix; increments gather in the
process for CAPACITY_COUNTERS_GATHER_SECONDS and then reach Redis together on the lane store's Redis thread,
and never delay or fail a call.

Decisions are also kept per minute for the last hour (`decisions_per_minute`, the staff lanes page's
chart): one small hash per minute (`decision -> count`, keys.decisions_minute_key) that expires an hour
after its minute, so the series is bounded (at most SERIES_MINUTES + 1 hashes of a few fields) however
long the service runs. A call counts in the minute its API process's clock was in when it was decided.
"""
import threading
import time
from collections import Counter

from django.conf import settings

from capacity.constants import DECISION_SERIES_MINUTES as SERIES_MINUTES
from capacity.store import Unknown, get_store
from common.process import PerProcess

SEPARATOR = '|'


class Pending:
    """Increments gathered in this process and not yet sent."""

    def __init__(self):
        self.counts = Counter()  # (key prefix, field) -> increments
        self.minutes = Counter()  # (key prefix, minute, decision) -> increments
        self.lock = threading.Lock()
        self.flush_queued = False


_pending = PerProcess(Pending)


def increment(*fields, minutes=()):
    """Add 1 to each field (a tuple of labels), and to each `(minute, decision)` of `minutes` (whole minutes
    since the epoch), without making the caller wait for Redis.

    Increments gather in this process and one job at a time takes them to Redis on the lane store's Redis
    thread (LaneStore.add_counts_later), so counters never hold more than one of its few queue places (the
    calls' own operations need them). The job is queued CAPACITY_COUNTERS_GATHER_SECONDS after the first
    increment since the last one (by a timer thread; at once when it is 0): sent at each call, the job and its
    pipeline cost a heavy submission a tenth of its CPU (docs/benchmarks.md), while /metrics reads them at
    most every few seconds. A counter never costs a call anything: when they can't be sent (the skip
    window, a busy thread, an error) they are dropped.
    """
    if not fields and not minutes:
        return
    pending = _pending.get()
    prefix = settings.CAPACITY_KEY_PREFIX  # the prefix now, not when they are sent (tests change it)
    with pending.lock:
        for labels in fields:
            pending.counts[(prefix, SEPARATOR.join(str(label) for label in labels))] += 1
        for minute, decision in minutes:
            pending.minutes[(prefix, int(minute), str(decision))] += 1
        if pending.flush_queued:
            return
        pending.flush_queued = True
    store, gather = get_store(), settings.CAPACITY_COUNTERS_GATHER_SECONDS
    if gather <= 0:
        _send(pending, store)
        return
    timer = threading.Timer(gather, _send, (pending, store))
    timer.daemon = True  # what a process gathered in its last moment is dropped, never waited for
    try:
        timer.start()
    except RuntimeError:  # no thread to be had: send them now rather than never
        _send(pending, store)


def _send(pending, store):
    """Queue the job that takes what `pending` gathered to Redis."""
    if not store.add_counts_later(lambda: _take(pending)):
        _take(pending)  # not queued: these are dropped, and the next increment queues a job again


def _take(pending):
    """The gathered increments by the key prefix they were counted under, `{prefix: ({field: n},
    {(minute, decision): n})}`, now gone from `pending` (on the Redis thread, or when dropped)."""
    with pending.lock:
        counts, minutes = dict(pending.counts), dict(pending.minutes)
        pending.counts.clear()
        pending.minutes.clear()
        pending.flush_queued = False
    taken = {}
    for (prefix, field), count in counts.items():
        taken.setdefault(prefix, ({}, {}))[0][field] = count
    for (prefix, minute, decision), count in minutes.items():
        taken.setdefault(prefix, ({}, {}))[1][(minute, decision)] = count
    return taken


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
    increment(*fields, minutes=[(time.time() // 60, admission.decision)])


def decisions_per_minute(minutes=SERIES_MINUTES, now=None):
    """The last `minutes` whole minutes (1 to SERIES_MINUTES), oldest first, this one last:
    `[{"minute": <epoch seconds of its start>, "decisions": {decision: count}}]`, a minute without calls
    having no decisions; Unknown (capacity.store) when Redis can't say. One round trip."""
    current = int((time.time() if now is None else now) // 60)
    wanted = range(current - min(max(int(minutes), 1), SERIES_MINUTES) + 1, current + 1)
    counts = get_store().decision_counts(list(wanted))
    if isinstance(counts, Unknown):
        return counts
    return [{'minute': minute * 60, 'decisions': decisions} for minute, decisions in zip(wanted, counts)]


def record_served(queue, served_as):
    """Count one call by how it was served: `run` (its own work), `coalesced` (joined an identical call's
    work), `cached` (answered from an identical call's stored result)."""
    increment(('served', queue, str(served_as)))


def record_end(queue, state, count=1):
    """Count `count` calls that ended (succeeded, failed, cancelled, expired) on `queue`."""
    increment(*[('finished', queue, str(state))] * count)
