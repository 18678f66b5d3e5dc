"""When and how long to wait before sending a call again: Retry-After with jitter, bounded.

A 429 (capacity or rate limit) is waited out for the server's Retry-After plus up to `jitter` of it
(never less: the server said when, from how long its calls hold a slot), each wait capped at
`max_delay_seconds`. A paused lane (`paused: true` in the 429) doesn't clear by waiting: the call stops at
once with LanePaused, unless `wait_paused` asks to wait it out like any other refusal. No answer or a 5xx
backs off exponentially with jitter (honouring a Retry-After when the 5xx has one). Every retry of a call
reuses its Idempotency-Key, so a call the server did take before the connection dropped is answered with
its handle, not run twice. A call stops after `max_attempts` sends or when the next wait would take its
total waiting past `max_wait_seconds`: then GaveUp.

A Holdback makes one call's 429 hold back the others that share it (a run's calls): none is sent before
the refused call's wait is over, so one refusal does not set off a burst of them.
"""
import random
import threading
from dataclasses import dataclass

from heavy_lanes_client import errors


class Stopped(Exception):
    """The caller asked to stop (Ctrl-C) while a call waited to be sent (again).

    `uncertain`: an earlier send of the call got no answer, so the server may have taken it.
    """

    def __init__(self, uncertain=False):
        super().__init__('stopped before the call was sent' + (' again' if uncertain else ''))
        self.uncertain = uncertain


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 10            # sends of one call, the first included
    max_wait_seconds: float = 900.0   # total waiting of one call before it gives up
    max_delay_seconds: float = 300.0  # cap on any one wait (a paused lane says 120 s)
    jitter: float = 0.2               # a 429 wait is Retry-After * (1 + U(0, jitter)) (+ U(0, jitter) s)
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    wait_paused: bool = False         # wait out a paused lane's Retry-After instead of stopping at once

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError('max_attempts must be at least 1')
        if self.max_wait_seconds < 0 or self.max_delay_seconds < 0 or self.jitter < 0:
            raise ValueError('waits and jitter must not be negative')

    def backoff(self, attempt, rng):
        """Exponential backoff with jitter for the `attempt`-th failure (1-based), in seconds."""
        ceiling = min(self.backoff_max_seconds, self.backoff_base_seconds * 2 ** max(attempt - 1, 0))
        return rng.uniform(ceiling / 2, ceiling)

    def delay(self, error, attempt, rng=random):
        """Seconds to wait after `error` on the `attempt`-th send before sending again."""
        if isinstance(error, errors.Refused):
            if error.retry_after is None:
                return min(self.backoff(attempt, rng), self.max_delay_seconds)
            base = min(error.retry_after, self.max_delay_seconds)
            return base + rng.uniform(0, self.jitter * max(base, 1.0))
        wait = self.backoff(attempt, rng)
        if error.retry_after is not None:
            wait = max(wait, error.retry_after)
        return min(wait, self.max_delay_seconds)


class Holdback:
    """The latest time (on `clock`, in seconds) before which no call may be sent. Thread-safe."""

    def __init__(self, clock):
        self.clock = clock
        self._until = 0.0
        self._lock = threading.Lock()

    def hold(self, seconds):
        """A call was told to wait `seconds`: send nothing before then. Returns that time."""
        with self._lock:
            until = self.clock() + seconds
            self._until = max(self._until, until)
            return until

    def pause(self, own_until=0.0):
        """Seconds to wait before a send; 0 when nothing holds it back, or when the hold is no later than
        `own_until` (the caller's own, which it has waited out)."""
        with self._lock:
            until = self._until
        pause = until - self.clock()
        return 0.0 if pause <= 0 or until <= own_until else pause


def call_with_retries(send, policy, *, wait, rng=random, before_attempt=None, on_error=None):
    """Run `send(attempt)` until it returns, retrying retryable ClientErrors under `policy`.

    `wait(seconds, error)` sleeps and returns true when the caller wants to stop (then Stopped is raised);
    `before_attempt()` may wait too (e.g. for a Retry-After another call got) and returns the seconds it
    waited, which count towards the total; `on_error(error, delay)` sees every failure before its wait
    (`delay` None when there will be no retry). Non-retryable errors are raised as they are.
    """
    waited = 0.0
    attempt = 0
    while True:
        if before_attempt is not None:
            waited += before_attempt()
        attempt += 1
        try:
            return send(attempt)
        except errors.ClientError as ex:
            if not ex.retryable:
                if on_error is not None:
                    on_error(ex, None)
                raise
            if isinstance(ex, errors.CapacityRefused) and ex.paused and not policy.wait_paused:
                if on_error is not None:
                    on_error(ex, None)
                lane = f'lane {ex.scope}' if ex.scope else 'a lane'
                raise errors.LanePaused(
                    f'stopped: {lane} is paused on the server (its limit is 0), and waiting will not clear '
                    f'it; ask its operators to resume it, or wait it out (--wait-paused)',
                    last=ex, attempts=attempt, waited=waited) from ex
            delay = policy.delay(ex, attempt, rng)
            if attempt >= policy.max_attempts or waited + delay > policy.max_wait_seconds:
                if on_error is not None:
                    on_error(ex, None)
                sends = f'{attempt} attempt{"s" if attempt > 1 else ""}'
                why = f'{waited:.0f} s waiting'
                if attempt < policy.max_attempts:
                    why += f'; {delay:.0f} s more would pass the {policy.max_wait_seconds:g} s limit'
                raise errors.GaveUp(f'gave up after {sends} ({why}): {ex.reason}',
                                    last=ex, attempts=attempt, waited=waited) from ex
            if on_error is not None:
                on_error(ex, delay)
            if wait(delay, ex):
                raise Stopped() from ex
            waited += delay
