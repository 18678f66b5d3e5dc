"""A run's tally: each batch's row outcomes, the answers its sends got (by kind), the calls waiting out a
429 and the seconds they spent, and from these the RunReport it ends with. Thread-safe.

The first outcome recorded for a batch is kept; a later one (cancel() racing the batch's own thread) is
dropped, so every row is counted once.
"""
import threading
from collections import Counter
from contextlib import contextmanager

from heavy_lanes_client import errors
from heavy_lanes_client.models import RowStatus, RunReport, State, Summary

# The Summary's counts of calls and tasks, as the tally keeps them.
COUNTED = ('submissions', 'admitted', 'shadow_refused', 'refused_capacity', 'rate_limited', 'server_errors',
           'connection_errors', 'rejected', 'tasks_failed', 'tasks_expired', 'tasks_cancelled')


def answer_kind(error):
    """The count a send that failed with `error` goes to: a capacity refusal, a rate limit, no answer, a 5xx
    or another 4xx."""
    if isinstance(error, errors.CapacityRefused):
        return 'refused_capacity'
    if isinstance(error, errors.RateLimited):
        return 'rate_limited'
    if isinstance(error, errors.TransportError):
        return 'connection_errors'
    if isinstance(error, errors.ServerError):
        return 'server_errors'
    return 'rejected'


class Tally:
    """The counts of one run; see the module docstring. `clock` times the waits, in seconds."""

    def __init__(self, clock):
        self.clock = clock
        self._lock = threading.Lock()
        self._outcomes = {}      # batch index -> [RowOutcome]
        self._rows = Counter()   # RowStatus -> rows recorded
        self._counts = Counter()  # one of COUNTED -> calls or tasks
        self._waiting = set()    # batches waiting out a 429
        self._running = {}       # batch index -> rows its call's run has done on the server, until recorded
        self._capacity_wait = 0.0

    def count(self, name):
        with self._lock:
            self._counts[name] += 1

    def admitted(self, capacity):
        """A send was answered with a handle; `capacity` are the answer's X-OCL-Capacity-* headers."""
        with self._lock:
            self._counts['admitted'] += 1
            if capacity.decision == 'shadow-refused':
                self._counts['shadow_refused'] += 1

    def record(self, batch, outcomes, state=None):
        """Keep `outcomes` as the batch's rows, and its task's final `state`, unless the batch has rows
        already (then return False)."""
        with self._lock:
            if batch.index in self._outcomes:
                return False
            self._outcomes[batch.index] = outcomes
            self._running.pop(batch.index, None)
            for outcome in outcomes:
                self._rows[outcome.status] += 1
            if state in (State.FAILED, State.EXPIRED, State.CANCELLED):
                self._counts[f'tasks_{state}'] += 1
            return True

    def running(self, batch, rows_done):
        """The server says `batch`'s call has done `rows_done` rows (None: it doesn't say, or not running)."""
        with self._lock:
            if batch.index in self._outcomes or not rows_done:
                self._running.pop(batch.index, None)
            else:
                self._running[batch.index] = rows_done

    def running_rows(self):
        """Rows done on the server by calls whose rows aren't recorded yet."""
        with self._lock:
            return sum(self._running.values())

    @contextmanager
    def waiting_for_capacity(self, batch):
        """Count `batch` as waiting out a 429 for the duration, and the time towards the capacity wait."""
        with self._lock:
            self._waiting.add(batch.index)
        started = self.clock()
        try:
            yield
        finally:
            with self._lock:
                self._waiting.discard(batch.index)
                self._capacity_wait += self.clock() - started

    def progress(self):
        """Rows recorded so far by RowStatus, and the number of calls waiting out a 429."""
        with self._lock:
            return dict(self._rows), len(self._waiting)

    def report(self, job, batches, unrecorded, **summary):
        """The RunReport: every batch's rows in input order (`unrecorded(batch)` for a batch that has none),
        and the Summary of the counts; `summary` holds its other fields (max_in_flight, wall_seconds,
        interrupted)."""
        with self._lock:
            recorded = dict(self._outcomes)
            counts = Counter(self._counts)
            capacity_wait = self._capacity_wait
        outcomes = []
        for batch in batches:
            got = recorded.get(batch.index)
            outcomes.extend(got if got is not None else unrecorded(batch))
        statuses = Counter(outcome.status for outcome in outcomes)
        return RunReport(summary=Summary(
            endpoint=job.endpoint, rows=len(outcomes), matched=statuses[RowStatus.MATCHED],
            no_match=statuses[RowStatus.NO_MATCH], failed=statuses[RowStatus.FAILED], batches=len(batches),
            capacity_wait_seconds=round(capacity_wait, 3), **summary,
            **{name: counts[name] for name in COUNTED}), outcomes=tuple(outcomes))
