"""Load generator: N simulated users of mixed tiers making heavy calls for a set time, every call accounted.

    plan = LoadPlan(url='http://127.0.0.1:8000', users=8, seconds=30, staff_token='STAFFKEY',
                    accounts=(Account('core', 'KEY1'), Account('preview', 'KEY2')))
    report = LoadGenerator(plan).run()
    print(format_load_report(report)); sys.exit(0 if report.ok else 1)

Each user is a thread with one token (users take the accounts in turn) and one call in flight at a time.
It picks a kind of call by the `mix` weights — `single` (semantic `$match`, 1 row), `bulk` (semantic
`$match`, `bulk_rows` rows), `bulk-rerank` (reranked lexical `$match`) or `rerank` (`$rerank` of
`bulk_rows` candidates) — with rows drawn from the built-in phrases, sends it (capacity-aware, with an
Idempotency-Key; a dropped connection or 5xx is resent with the same key, at most 3 sends), then
long-polls its task. A 429 ends that call as `refused` (or `rate_limited`) and the user waits out the
Retry-After (with jitter, at most `max_backoff` s) before its next call, as a well-behaved client would.

Users send new calls for `seconds`; then calls in flight get `drain_seconds` to finish; whatever is
still open after that is cancelled (DELETE). At the end every call is in exactly one bucket: finished
(succeeded / failed / expired / cancelled, by the task's final state), refused, rate_limited or error.
A call in none of them is *unaccounted*, and `report.ok` is False.

With a staff token, `/capacity/status/` is sampled every `sample_interval` s (50–1000 ms) for the largest
in-flight count seen per lane; the users' own open tasks per queue are counted exactly on the client side.

Only loopback URLs are accepted (127.0.0.0/8, ::1, localhost): this is a test tool for a server you run
yourself. Users, time and every wait are bounded.
"""
import random
import threading
import time
import uuid

from heavy_lanes_client import errors
from heavy_lanes_client.client import Client
from heavy_lanes_client.ledger import Ledger, Outcome, outcome_of
from heavy_lanes_client.load_plan import Account, LoadPlan
from heavy_lanes_client.load_report import LaneMax, LoadReport, by_kind, by_tier
from heavy_lanes_client.models import State
from heavy_lanes_client.phrases import PHRASES
from heavy_lanes_client.retry import RetryPolicy
from heavy_lanes_client.sampler import Sampler

# bench/soak.py reaches the plan's values through this module, and swaps `Client` here to record answers.
__all__ = ['Account', 'Client', 'LoadGenerator', 'LoadPlan']

MAX_SENDS = 3  # sends of one call when the connection drops or the server answers 5xx


class LoadGenerator:
    def __init__(self, plan, clock=time.monotonic):
        self.plan = plan
        self.clock = clock
        self.ledger = Ledger()
        self.stop = threading.Event()          # Ctrl-C, or the drain time is over: stop sending and polling
        self.threads = []
        self.retry = RetryPolicy(max_attempts=MAX_SENDS, max_delay_seconds=plan.max_backoff)
        self.source = plan.source
        self.interrupted = False
        self.end = None
        self.drain_until = None

    # --- one user --------------------------------------------------------------------------------------

    def _user(self, number, account):
        plan = self.plan
        rng = random.Random(None if plan.seed is None else plan.seed * 1000 + number)
        kinds = [kind for kind, _ in plan.mix]
        weights = [weight for _, weight in plan.mix]
        client = Client(plan.url, account.token, timeout=(3.0, plan.http_timeout), pool_size=2, rng=rng)
        try:
            while not self.stop.is_set() and self.clock() < self.end:
                kind = rng.choices(kinds, weights)[0]
                pause = self._call(client, number, account, kind, rng)
                if pause is None:  # this token can't make calls at all
                    return
                pause += rng.uniform(0, plan.think_seconds)
                pause = min(pause, max(0.0, self.end - self.clock()))
                if pause > 0 and self.stop.wait(pause):
                    return
        finally:
            client.close()

    def _send(self, client, kind, rng, key):
        plan = self.plan
        count = 1 if kind == 'single' else plan.bulk_rows
        names = rng.sample(PHRASES, min(count, len(PHRASES)))
        names += [rng.choice(PHRASES) for _ in range(count - len(names))]
        if kind == 'rerank':
            return client.submit_rerank(rng.choice(PHRASES), names, idempotency_key=key)
        return client.submit_match(names, self.source, semantic=kind in ('single', 'bulk'),
                                   reranker=kind == 'bulk-rerank', limit=5, idempotency_key=key)

    def _call(self, client, number, account, kind, rng):
        """Make one call and see it to its end; returns the pause before the next one (None: stop)."""
        call = self.ledger.open(user=number, tier=account.tier, kind=kind,
                                rows=1 if kind == 'single' else self.plan.bulk_rows, started=self.clock(),
                                key=f'load-{uuid.uuid4().hex}')
        handle = None
        for attempt in range(1, MAX_SENDS + 1):
            self.ledger.sent(call)
            try:
                handle = self._send(client, kind, rng, call.key)
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
            self.ledger.resolve(call, outcome_of(handle.immediate.state), latency=self.clock() - call.started)
            return 0.0
        if not self.ledger.admit(call, handle):
            self._cancel(client, call, handle)
            return 0.0
        self._follow(client, call, handle, rng)
        return 0.0

    def _follow(self, client, call, handle, rng):
        """Long-poll the task until it ends, or until the drain time is over or we stop (then the cancel
        pass deals with it)."""
        failures = 0
        while not self.stop.is_set():
            remaining = (self.drain_until if self.drain_until is not None else float('inf')) - self.clock()
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

    def _cancel(self, client, call, handle):
        try:
            task = client.cancel(handle)
        except errors.ClientError as ex:
            reason = f'cancel failed: {ex.reason}; task {handle.id} may still run'
            self.ledger.resolve(call, Outcome.ERROR, reason)
            return
        if task.finished:
            reason = 'cancelled at the end of the load run' if task.state == State.CANCELLED else task.error
            latency = self.clock() - call.started if task.state == State.SUCCEEDED else None
            self.ledger.resolve(call, outcome_of(task.state), reason, latency=latency)
        else:
            self.ledger.resolve(call, Outcome.ERROR, f'task {handle.id} still {task.state} after cancel')

    # --- the whole run -----------------------------------------------------------------------------------

    def _find_source(self):
        if self.source or all(kind == 'rerank' for kind, weight in self.plan.mix if weight > 0):
            return
        token = self.plan.accounts[0].token
        with Client(self.plan.url, token, timeout=(3.0, self.plan.http_timeout)) as client:
            sources = client.sources()
        if not sources:
            raise ValueError('the server has no sources loaded; give --source or use only rerank calls')
        self.source = sources[0].url

    def run(self):
        """Run the plan; returns the LoadReport. Ctrl-C ends it early (cancelling open tasks) and reports."""
        plan = self.plan
        self._find_source()
        sampler_stop = threading.Event()
        sampler = None
        if plan.staff_token:
            sampler = Sampler(Client(plan.url, plan.staff_token, timeout=(1.0, 2.0), pool_size=2),
                              plan.sample_interval, sampler_stop)
        started = self.clock()
        self.end = started + plan.seconds
        self.drain_until = self.end + plan.drain_seconds
        if sampler is not None:
            sampler.thread.start()
        try:
            for number in range(plan.users):
                account = plan.accounts[number % len(plan.accounts)]
                thread = threading.Thread(target=self._user, args=(number, account),
                                          name=f'heavy-lanes-load-user-{number}', daemon=True)
                self.threads.append(thread)
                thread.start()
            try:
                while self.clock() < self.drain_until and any(thread.is_alive() for thread in self.threads):
                    time.sleep(min(0.05, max(0.0, self.drain_until - self.clock())))
            except KeyboardInterrupt:
                self.interrupted = True
            self.stop.set()
            self._cancel_pass()
            # A long poll ends by the drain deadline, so one request timeout (plus slack) bounds the wait.
            join_until = self.clock() + plan.http_timeout + 1.0
            for thread in self.threads:
                thread.join(max(0.0, join_until - self.clock()))
        finally:
            self.stop.set()
            sampler_stop.set()
            if sampler is not None:
                sampler.thread.join(timeout=5.0)
        return self._report(started, sampler)

    def _cancel_pass(self):
        """Cancel every task still open (the drain time is over, or Ctrl-C)."""
        open_calls = self.ledger.take_open()
        if not open_calls:
            return
        clients = {}
        try:
            for call in open_calls:
                account = self.plan.accounts[call.user % len(self.plan.accounts)]
                client = clients.get(account.token)
                if client is None:
                    client = clients[account.token] = Client(self.plan.url, account.token,
                                                             timeout=(3.0, self.plan.http_timeout))
                self._cancel(client, call, call.handle)
        finally:
            for client in clients.values():
                client.close()

    def _report(self, started, sampler):
        calls = self.ledger.results()
        client_lanes = tuple(LaneMax(lane, count, None)
                             for lane, count in sorted(self.ledger.lane_maxima().items()))
        server_lanes = queue_depths = ()
        if sampler is not None:
            server_lanes = tuple(LaneMax(lane, value, limit)
                                 for lane, (value, limit) in sampler.lanes.items())
            queue_depths = tuple(LaneMax(queue, value, pool)
                                 for queue, (value, pool) in sampler.depths.items())
        return LoadReport(
            url=self.plan.url, users=self.plan.users, seconds=self.plan.seconds,
            wall_seconds=round(self.clock() - started, 3), calls=calls, by_tier=by_tier(calls),
            by_kind=by_kind(calls), server_lanes=server_lanes, client_lanes=client_lanes,
            queue_depths=queue_depths, samples=sampler.samples if sampler else 0,
            sample_errors=sampler.errors if sampler else 0,
            sample_note=sampler.report_note() if sampler else None, interrupted=self.interrupted)
