"""One simulated user of the load generator: heavy calls one at a time, each recorded in the Ledger.

The user picks a kind of call by the plan's `mix` weights: `single` (semantic `$match`, 1 row), `bulk`
(semantic `$match`, `bulk_rows` rows), `bulk-rerank` (reranked lexical `$match`) or `rerank` (`$rerank` of
`bulk_rows` candidates), with rows drawn from the built-in phrases. It sends the call (capacity-aware,
with an Idempotency-Key; a dropped connection or a 5xx is resent with the same key, at most MAX_SENDS
sends), then long-polls its task. A 429 ends the call as `refused` (or `rate_limited`), and the user waits
out the Retry-After (with jitter, at most `max_backoff` s) before its next call, as a well-behaved client
would. No call starts after `end`, and no poll after `drain_until`: what is open then is for `cancel`.
"""
import random
import uuid

from heavy_lanes_client import errors
from heavy_lanes_client.ledger import Outcome, outcome_of
from heavy_lanes_client.models import State
from heavy_lanes_client.phrases import PHRASES
from heavy_lanes_client.retry import RetryPolicy

MAX_SENDS = 3  # sends of one call when the connection drops or the server answers 5xx


class User:
    """User `number` of a load run, calling with `account`'s token through `connect(rng)`, a new Client.
    `end` and `drain_until` are times on `clock`; `stop` (an Event) ends the user early."""

    def __init__(self, number, account, plan, *, source, ledger, stop, clock, end, drain_until, connect):
        self.number = number
        self.account = account
        self.plan = plan
        self.source = source
        self.ledger = ledger
        self.stop = stop
        self.clock = clock
        self.end = end
        self.drain_until = drain_until
        self.connect = connect
        self.retry = RetryPolicy(max_attempts=MAX_SENDS, max_delay_seconds=plan.max_backoff)

    def run(self):
        """Make calls until `end` or `stop`; the user's thread runs this."""
        plan = self.plan
        rng = random.Random(None if plan.seed is None else plan.seed * 1000 + self.number)
        kinds = [kind for kind, _ in plan.mix]
        weights = [weight for _, weight in plan.mix]
        client = self.connect(rng)
        try:
            while not self.stop.is_set() and self.clock() < self.end:
                kind = rng.choices(kinds, weights)[0]
                pause = self._call(client, kind, rng)
                if pause is None:  # this token can't make calls at all
                    return
                pause += rng.uniform(0, plan.think_seconds)
                pause = min(pause, max(0.0, self.end - self.clock()))
                if pause > 0 and self.stop.wait(pause):
                    return
        finally:
            client.close()

    def _rows(self, kind):
        return 1 if kind == 'single' else self.plan.bulk_rows

    def _draw(self, kind, rng):
        """One call's inputs: (rerank query or None, row names). Drawn once per call: a resend with the same
        Idempotency-Key must carry the same body (another one is a 422)."""
        count = self._rows(kind)
        names = rng.sample(PHRASES, min(count, len(PHRASES)))
        names += [rng.choice(PHRASES) for _ in range(count - len(names))]
        return (rng.choice(PHRASES) if kind == 'rerank' else None), names

    def _send(self, client, kind, drawn, key):
        query, names = drawn
        wait = self._first_wait()
        if kind == 'rerank':
            return client.submit_rerank(query, names, idempotency_key=key, wait=wait)
        return client.submit_match(names, self.source, semantic=kind in ('single', 'bulk'),
                                   reranker=kind == 'bulk-rerank', limit=5, idempotency_key=key, wait=wait)

    def _first_wait(self):
        """How long the submission itself may wait for the result (the first long-poll, in the POST)."""
        if not (self.plan.submit_wait and self.plan.long_poll):
            return 0
        return int(max(0, min(self.plan.long_poll, self.drain_until - self.clock())))

    def _call(self, client, kind, rng):
        """Make one call and see it to its end; returns the pause before the next one (None: stop)."""
        call = self.ledger.open(user=self.number, tier=self.account.tier, kind=kind, rows=self._rows(kind),
                                started=self.clock(), key=f'load-{uuid.uuid4().hex}')
        handle = None
        drawn = self._draw(kind, rng)
        for attempt in range(1, MAX_SENDS + 1):
            self.ledger.sent(call)
            try:
                handle = self._send(client, kind, drawn, call.key)
                break
            except errors.Refused as ex:
                self.ledger.answered(call, ex.status, ex.capacity)
                outcome = Outcome.REFUSED if isinstance(ex, errors.CapacityRefused) else Outcome.RATE_LIMITED
                self.ledger.resolve(call, outcome, ex.reason)
                return min(self.retry.delay(ex, 1, rng), self.plan.max_backoff)
            except (errors.TransportError, errors.ServerError) as ex:
                self.ledger.answered(call, ex.status, ex.capacity)
                if attempt == MAX_SENDS or self.stop.is_set():
                    self.ledger.resolve(call, Outcome.ERROR, ex.reason)
                    return self.retry.backoff(attempt, rng)
                if self.stop.wait(self.retry.delay(ex, attempt, rng)):
                    self.ledger.resolve(call, Outcome.ERROR, f'{ex.reason}; not resent: stopping')
                    return 0.0
            except errors.ClientError as ex:
                self.ledger.answered(call, ex.status, ex.capacity)
                self.ledger.resolve(call, Outcome.ERROR, ex.reason)
                return None if isinstance(ex, errors.AuthError) else 1.0
        self.ledger.answered(call, 202 if handle.immediate is None else 200, handle.capacity)
        if handle.immediate is not None:
            self.ledger.resolve(call, outcome_of(handle.immediate.state), handle.immediate.error,
                                latency=self.clock() - call.started, task_id=handle.id)
            return 0.0
        if not self.ledger.admit(call, handle):
            cancel(client, self.ledger, call, handle, self.clock)
            return 0.0
        self._follow(client, call, handle, rng)
        return 0.0

    def _follow(self, client, call, handle, rng):
        """Long-poll the task until it ends, or until the drain time is over or we stop (then the cancel
        pass deals with it)."""
        failures = 0
        while not self.stop.is_set():
            remaining = self.drain_until - self.clock()
            if remaining <= 0:
                return
            started = self.clock()
            try:
                task = client.get_task(handle, wait=int(min(self.plan.long_poll, remaining)))
            except errors.ClientError as ex:
                if not ex.retryable:
                    self.ledger.resolve(call, Outcome.ERROR, f'{ex.reason} (task {handle.id})')
                    return
                failures += 1
                if failures >= 5:
                    reason = f'lost contact with task {handle.id}: {ex.reason}'
                    self.ledger.resolve(call, Outcome.ERROR, reason)
                    return
                self.stop.wait(min(self.retry.backoff(failures, rng), remaining))
                continue
            failures = 0
            if task.finished:
                latency = self.clock() - call.started
                self.ledger.resolve(call, outcome_of(task.state), task.error, latency=latency)
                return
            hint = task.poll_after if task.poll_after is not None else 1.0
            self.stop.wait(min(max(0.0, hint - (self.clock() - started)), remaining))


def cancel(client, ledger, call, handle, clock):
    """Cancel (DELETE) the task `handle` of `call`, and resolve the call by how the task ended."""
    try:
        task = client.cancel(handle)
    except errors.ClientError as ex:
        reason = f'cancel failed: {ex.reason}; task {handle.id} may still run'
        ledger.resolve(call, Outcome.ERROR, reason)
        return
    if task.finished:
        reason = 'cancelled at the end of the load run' if task.state == State.CANCELLED else task.error
        latency = clock() - call.started if task.state == State.SUCCEEDED else None
        ledger.resolve(call, outcome_of(task.state), reason, latency=latency)
    else:
        ledger.resolve(call, Outcome.ERROR, f'task {handle.id} still {task.state} after cancel')
