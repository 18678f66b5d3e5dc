"""The client's values: what the server answered and what became of each row. All frozen."""
import enum
import math
from dataclasses import dataclass, field

from heavy_lanes_client import ratelimit

HEADER_DECISION = 'X-OCL-Capacity-Decision'
HEADER_LIMIT = 'X-OCL-Capacity-Limit'
HEADER_IN_FLIGHT = 'X-OCL-Capacity-In-Flight'
HEADER_TIER = 'X-OCL-Capacity-Tier'
HEADER_TIER_LIMIT = 'X-OCL-Capacity-Tier-Limit'
HEADER_TIER_IN_FLIGHT = 'X-OCL-Capacity-Tier-In-Flight'
HEADER_SUGGESTED = 'X-OCL-Capacity-Suggested-Concurrency'

MATCH, RERANK = '$match', '$rerank'


class State(str, enum.Enum):
    """A task's state, as GET /tasks/<id>/ reports it."""

    QUEUED = 'queued'
    RUNNING = 'running'
    SUCCEEDED = 'succeeded'
    FAILED = 'failed'
    CANCELLED = 'cancelled'
    EXPIRED = 'expired'

    def __str__(self):
        return self.value

    @property
    def finished(self):
        return self not in (State.QUEUED, State.RUNNING)


class RowStatus(str, enum.Enum):
    """What became of one input row. NO_MATCH only ever means: the server ran it and found nothing."""

    MATCHED = 'matched'
    NO_MATCH = 'no_match'
    FAILED = 'failed'

    def __str__(self):
        return self.value


def _int_or_none(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def retry_after_seconds(value):
    """`Retry-After` as seconds (a non-negative number), or None when missing or not a number.

    The API sends whole seconds; an HTTP-date form is not used by it and reads as None.
    """
    try:
        seconds = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return None if math.isnan(seconds) else max(seconds, 0.0)


@dataclass(frozen=True)
class Capacity:
    """The X-OCL-Capacity-* headers of one answer; every field is None when the header was absent.

    Without them (a server or proxy that sends only the standard fields), `room` is read from the IETF
    RateLimit fields instead: how many more calls its concurrency quotas have room for now.
    """

    decision: str | None = None  # admitted, shadow-refused, refused, unavailable
    limit: int | None = None
    in_flight: int | None = None
    tier: str | None = None
    tier_limit: int | None = None
    tier_in_flight: int | None = None
    suggested: int | None = None  # calls this caller should keep in flight at once
    room: int | None = None       # RateLimit: the fewest more calls any concurrency quota takes now
    room_quota: int | None = None  # ... and the smallest of those quotas

    @classmethod
    def from_headers(cls, headers):
        decision = headers.get(HEADER_DECISION) or None
        standard = ratelimit.concurrency(headers) if decision is None else ratelimit.Concurrency()
        return cls(
            decision=decision,
            limit=_int_or_none(headers.get(HEADER_LIMIT)),
            in_flight=_int_or_none(headers.get(HEADER_IN_FLIGHT)),
            tier=headers.get(HEADER_TIER) or None,
            tier_limit=_int_or_none(headers.get(HEADER_TIER_LIMIT)),
            tier_in_flight=_int_or_none(headers.get(HEADER_TIER_IN_FLIGHT)),
            suggested=_int_or_none(headers.get(HEADER_SUGGESTED)),
            room=standard.left,
            room_quota=standard.quota,
        )

    @property
    def counted(self):
        """True when the server's limiter looked at the call (a decision header, or RateLimit fields of a
        concurrency quota)."""
        return self.decision is not None or self.room is not None


def whole(value):
    """An int the server sent, or None for anything else (a bool is not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Task:
    """GET /tasks/<id>/: where a heavy call is. `poll_after` is the server's Retry-After hint (s)."""

    id: str | None
    state: State
    endpoint: str | None = None
    lane: str | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    position: int | None = None
    result: object = None
    error: str | None = None
    poll_after: float | None = None
    estimated_start_at: str | None = None   # when the server expects it to start (None: unknown, or started)
    estimated_finish_at: str | None = None  # ... and to finish
    rows_done: int | None = None   # while running: the rows its run has done so far (the server's `progress`)
    rows_total: int | None = None

    @property
    def finished(self):
        return self.state.finished

    @classmethod
    def from_body(cls, body, poll_after=None):
        progress = body.get('progress') if isinstance(body.get('progress'), dict) else {}
        return cls(id=body.get('id'), state=State(body['state']), endpoint=body.get('endpoint'),
                   lane=body.get('lane'), created_at=body.get('created_at'),
                   started_at=body.get('started_at'), finished_at=body.get('finished_at'),
                   position=body.get('position'), result=body.get('result'), error=body.get('error'),
                   poll_after=poll_after, estimated_start_at=body.get('estimated_start_at'),
                   estimated_finish_at=body.get('estimated_finish_at'),
                   rows_done=whole(progress.get('rows_done')), rows_total=whole(progress.get('rows_total')))


@dataclass(frozen=True)
class Handle:
    """What a heavy call's submission answered: a task to poll, or (`immediate`) the finished result.

    `immediate` is set when the server answered 200 in the request (lexical `$match`, or `Prefer: wait`
    that finished); such a handle has no id to poll or cancel.
    """

    id: str | None
    url: str | None
    endpoint: str
    lane: str | None
    state: State
    idempotency_key: str | None
    capacity: Capacity = field(default_factory=Capacity)
    created_at: str | None = None
    immediate: Task | None = None

    @property
    def pollable(self):
        return self.immediate is None and self.url is not None


@dataclass(frozen=True)
class Source:
    """One loaded concept source (GET /sources/); `url` is what `target_repo_url` takes."""

    url: str
    name: str
    version: str | None = None
    concept_count: int | None = None
    org: str | None = None
    mnemonic: str | None = None


@dataclass(frozen=True)
class RowOutcome:
    """What became of one input row (a `$match` row, or a `$rerank` query).

    `top` is the best candidate when MATCHED; `reason` says why when FAILED (never set otherwise);
    `task_id` and `idempotency_key` identify the call that carried the row, to look it up later.
    """

    index: int
    name: str
    status: RowStatus
    top: dict | None = None
    candidates: tuple = ()
    reason: str | None = None
    task_id: str | None = None
    idempotency_key: str | None = None
    batch: int | None = None

    def as_dict(self):
        return {'index': self.index, 'name': self.name, 'status': str(self.status), 'top': self.top,
                'candidates': list(self.candidates), 'reason': self.reason, 'task_id': self.task_id,
                'idempotency_key': self.idempotency_key, 'batch': self.batch}


@dataclass(frozen=True)
class Summary:
    """The counts of one run: rows by outcome, submissions by answer, and times in seconds."""

    endpoint: str
    rows: int
    matched: int
    no_match: int
    failed: int
    batches: int
    submissions: int        # POSTs sent, retries included
    admitted: int           # answered 202/200: a handle (or, for a replayed key, the earlier handle)
    shadow_refused: int     # admitted, but a lane was full (shadow mode)
    refused_capacity: int   # 429 capacity_exceeded
    rate_limited: int       # 429 rate_limited
    server_errors: int      # 5xx answers
    connection_errors: int  # no answer (connection refused/reset, timeout)
    rejected: int           # other 4xx
    tasks_failed: int
    tasks_expired: int
    tasks_cancelled: int
    max_in_flight: int      # most calls held at once (being sent, waiting out a 429, or running)
    capacity_wait_seconds: float  # time calls spent waiting for capacity or a rate limit, summed
    wall_seconds: float
    interrupted: bool = False


@dataclass(frozen=True)
class RunReport:
    """A finished (or interrupted) run: its summary and one outcome per input row, in input order."""

    summary: Summary
    outcomes: tuple

    @property
    def failures(self):
        return tuple(outcome for outcome in self.outcomes if outcome.status == RowStatus.FAILED)

    @property
    def ok(self):
        """True when every row ran (matched or no match) and the run was not interrupted."""
        return not self.failures and not self.summary.interrupted
