"""The load generator's ledger: every call the users start, and the one outcome each ends with.

An outcome is the task's final state (succeeded, failed, expired, cancelled) or refused, rate_limited or
error; the first one recorded for a call is kept. A call with none is unaccounted. The ledger also counts
the users' own open tasks per queue, exactly, for the largest number seen at once.
"""
import threading
from collections import Counter
from dataclasses import dataclass

from heavy_lanes_client.models import State


class Outcome:
    """The buckets a call can end in."""

    SUCCEEDED, FAILED, EXPIRED, CANCELLED = 'succeeded', 'failed', 'expired', 'cancelled'
    REFUSED, RATE_LIMITED, ERROR = 'refused', 'rate_limited', 'error'
    ALL = (SUCCEEDED, FAILED, EXPIRED, CANCELLED, REFUSED, RATE_LIMITED, ERROR)


@dataclass
class _Call:
    """One call's ledger entry, changed only under the ledger's lock."""

    number: int
    user: int
    tier: str
    kind: str
    rows: int
    started: float
    key: str
    sends: int = 0
    status: int | None = None      # HTTP status of the last answer to the submission
    decision: str | None = None    # X-OCL-Capacity-Decision of that answer
    server_tier: str | None = None
    lane: str | None = None
    task_id: str | None = None
    handle: object = None
    outcome: str | None = None
    reason: str | None = None
    latency: float | None = None   # seconds from the first send to the final state


@dataclass(frozen=True)
class CallResult:
    """A call as the report keeps it; `admitted` when its submission was answered 200 or 202."""

    number: int
    user: int
    tier: str
    kind: str
    rows: int
    outcome: str | None
    decision: str | None
    server_tier: str | None
    lane: str | None
    task_id: str | None
    sends: int
    latency: float | None
    reason: str | None
    admitted: bool


class Ledger:
    """Every call the users start, and the one outcome each ends with (the first one recorded)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = []
        self.closed = False  # the final cancel pass has taken the open handles
        self.lanes_now = Counter()
        self.lanes_max = Counter()

    def open(self, **fields):
        with self._lock:
            call = _Call(number=len(self.calls), **fields)
            self.calls.append(call)
            return call

    def sent(self, call):
        with self._lock:
            call.sends += 1

    def answered(self, call, status, capacity):
        with self._lock:
            call.status = status
            if capacity is not None:
                call.decision = capacity.decision
                call.server_tier = capacity.tier or call.server_tier

    def admit(self, call, handle):
        """Note the task; False when the cancel pass already ran (the caller must cancel it itself)."""
        with self._lock:
            call.task_id, call.lane = handle.id, handle.lane
            if self.closed:
                return False
            call.handle = handle
            if handle.lane and call.outcome is None:
                self.lanes_now[handle.lane] += 1
                self.lanes_max[handle.lane] = max(self.lanes_max[handle.lane], self.lanes_now[handle.lane])
            return True

    def resolve(self, call, outcome, reason=None, latency=None, task_id=None):
        """Record the call's one outcome (`task_id`: of a call answered finished by its submission)."""
        with self._lock:
            if call.outcome is not None:
                return False
            call.outcome, call.reason, call.latency = outcome, reason, latency
            call.task_id = call.task_id or task_id
            if call.handle is not None and call.lane:
                self.lanes_now[call.lane] -= 1
            return True

    def take_open(self):
        """Close the ledger to new handles and return the calls whose tasks are still open."""
        with self._lock:
            self.closed = True
            return [call for call in self.calls if call.outcome is None and call.handle is not None]

    def lane_maxima(self):
        with self._lock:
            return dict(self.lanes_max)

    def results(self):
        with self._lock:
            return tuple(CallResult(
                number=call.number, user=call.user, tier=call.tier, kind=call.kind, rows=call.rows,
                outcome=call.outcome, decision=call.decision, server_tier=call.server_tier, lane=call.lane,
                task_id=call.task_id, sends=call.sends, latency=call.latency, reason=call.reason,
                admitted=call.status in (200, 202)) for call in self.calls)


def outcome_of(state):
    """The bucket of a call whose task ended in `state`."""
    return {State.SUCCEEDED: Outcome.SUCCEEDED, State.FAILED: Outcome.FAILED, State.EXPIRED: Outcome.EXPIRED,
            State.CANCELLED: Outcome.CANCELLED}[state]
