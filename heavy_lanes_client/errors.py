"""The client's errors: one small tree, so callers can tell *why* a call did not go through.

    ClientError                      base of everything the client raises for a call that did not work
    ├── TransportError               no HTTP answer: connection refused/reset, timeout (retryable)
    ├── ServerError                  5xx, e.g. 503 `queue_unavailable` (retryable; nothing was queued)
    │   └── ProtocolError            an answer the client can't read (not JSON, missing keys)
    ├── Refused                      429: wait `retry_after` seconds, then send the same call again
    │   ├── CapacityRefused          `capacity_exceeded`: a lane is full (`scope`, `paused`)
    │   └── RateLimited              `rate_limited`: the caller's rate limit, not capacity
    ├── RequestRejected              any other 4xx: sending it again won't help
    │   ├── InvalidRequest           400 `invalid`: `fields` maps each bad field to its messages
    │   ├── AuthError                401/403: bad token, or staff-only endpoint
    │   ├── IdempotencyConflict      422: the Idempotency-Key was used for another payload
    │   └── TaskNotFound             404 on a task: gone, or not the caller's
    └── GaveUp                       retries exhausted (`attempts`, `waited`); `last` is the final error
        └── LanePaused               a paused lane (`paused: true`): waiting won't clear it, so the call
                                     stopped at once (RetryPolicy.wait_paused waits it out instead)

    RunInterrupted(KeyboardInterrupt)  Ctrl-C during Run.execute(): the run's tasks were cancelled, and
                                       `report` holds every row's outcome (cancelled rows are "failed").

Errors that drive control flow carry their data: `status`, `error_code`, `detail`, `retry_after` (whole
seconds, from the `Retry-After` header or body), and `capacity` (the X-OCL-Capacity-* headers).
"""


class ClientError(Exception):
    """A call that did not work. `retryable` says whether sending the same call again may succeed."""

    retryable = False

    def __init__(self, message, status=None, error_code=None, detail=None, capacity=None, retry_after=None):
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.detail = detail
        self.capacity = capacity
        self.retry_after = retry_after

    @property
    def reason(self):
        """A one-line reason for a summary table or an output file."""
        return str(self)


class TransportError(ClientError):
    """No HTTP answer at all. The server may still have acted on the call: retry with the same key."""

    retryable = True

    def __init__(self, message, cause=None):
        super().__init__(message)
        self.cause = cause


class ServerError(ClientError):
    """The server answered 5xx; the call was not queued (503) or failed on the way."""

    retryable = True


class ProtocolError(ServerError):
    """The server answered something the client can't read."""


class Refused(ClientError):
    """429: come back in `retry_after` seconds."""

    retryable = True


class CapacityRefused(Refused):
    """429 `capacity_exceeded`: the lane `scope` is full, or paused (limit 0) when `paused`."""

    def __init__(self, message, scope=None, paused=False, **kwargs):
        super().__init__(message, **kwargs)
        self.scope = scope
        self.paused = paused


class RateLimited(Refused):
    """429 `rate_limited` (or any 429 that is not a capacity refusal): the caller's own rate limit."""


class RequestRejected(ClientError):
    """A 4xx other than 429: the request itself is wrong; sending it again gives the same answer."""


class InvalidRequest(RequestRejected):
    """400: `fields` maps each bad field (`rows`, `target_repo_url`, `limit`, `q`...) to its messages."""

    def __init__(self, message, fields=None, **kwargs):
        super().__init__(message, **kwargs)
        self.fields = fields or {}


class AuthError(RequestRejected):
    """401 (no or bad token) or 403 (not allowed, e.g. a staff-only endpoint)."""


class IdempotencyConflict(RequestRejected):
    """422: this Idempotency-Key was already used by this user for a different request."""


class TaskNotFound(RequestRejected):
    """404 for a task: it does not exist, or it is not the caller's."""


class GaveUp(ClientError):
    """Retries exhausted: `attempts` calls sent, `waited` seconds spent waiting, `last` the final error."""

    def __init__(self, message, last=None, attempts=0, waited=0.0):
        super().__init__(message, status=getattr(last, 'status', None),
                         error_code=getattr(last, 'error_code', None), detail=getattr(last, 'detail', None),
                         capacity=getattr(last, 'capacity', None),
                         retry_after=getattr(last, 'retry_after', None))
        self.last = last
        self.attempts = attempts
        self.waited = waited


class LanePaused(GaveUp):
    """A capacity 429 for a paused lane (its limit is 0: operators stopped it). It doesn't clear by waiting,
    so the call stops at its first refusal instead of waiting out its budget; `scope` names the lane."""

    def __init__(self, message, last=None, attempts=0, waited=0.0):
        super().__init__(message, last=last, attempts=attempts, waited=waited)
        self.scope = getattr(last, 'scope', None)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a Run; its tasks were cancelled and `report` accounts for every row."""

    def __init__(self, report):
        super().__init__('run interrupted; its tasks were cancelled')
        self.report = report
