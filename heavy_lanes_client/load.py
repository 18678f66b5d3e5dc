"""Load generator: N simulated users of mixed tiers making heavy calls for a set time, every call accounted.

    plan = LoadPlan(url='http://127.0.0.1:8000', users=8, seconds=30, staff_token='STAFFKEY',
                    accounts=(Account('core', 'KEY1'), Account('preview', 'KEY2')))
    report = LoadGenerator(plan).run()
    print(format_load_report(report)); sys.exit(0 if report.ok else 1)   # from load_report

This module runs the whole of it. Each user is a thread (user.User) with one token (users take the
accounts in turn) and one call in flight at a time. Users send new calls for `seconds`; then calls in
flight get `drain_seconds` to finish; whatever is still open after that is cancelled (DELETE). At the end
every call is in exactly one bucket of the Ledger: finished (succeeded / failed / expired / cancelled, by
the task's final state), refused, rate_limited or error. A call in none of them is *unaccounted*, and
`report.ok` is False.

With a staff token, `/capacity/status/` is sampled (sampler.Sampler) every `sample_interval` s for the
largest in-flight count seen per lane; the users' own open tasks per queue are counted exactly on the
client side.

Only loopback URLs are accepted (load_plan.require_loopback): this is a test tool for a server you run
yourself. Users, time and every wait are bounded.
"""
import threading
import time

from heavy_lanes_client.client import Client
from heavy_lanes_client.ledger import Ledger
from heavy_lanes_client.load_plan import Account, LoadPlan
from heavy_lanes_client.load_report import LaneMax, LoadReport, by_kind, by_tier
from heavy_lanes_client.sampler import Sampler
from heavy_lanes_client.user import User, cancel

# bench/soak.py builds its plan from load.Account and load.LoadPlan, and swaps load.Client to record answers.
__all__ = ['Account', 'Client', 'LoadGenerator', 'LoadPlan']


class LoadGenerator:
    """Runs one LoadPlan, once; see the module docstring. `clock` gives seconds (monotonic)."""

    def __init__(self, plan, clock=time.monotonic):
        self.plan = plan
        self.clock = clock
        self.ledger = Ledger()
        self.stop = threading.Event()          # Ctrl-C, or the drain time is over: stop sending and polling
        self.threads = []
        self.source = plan.source
        self.interrupted = False
        self.end = None
        self.drain_until = None

    def _client(self, token, **options):
        """A Client of the plan's server, built from this module's `Client` (which bench/soak.py swaps)."""
        return Client(self.plan.url, token, timeout=(3.0, self.plan.http_timeout), **options)

    def _account(self, user):
        return self.plan.accounts[user % len(self.plan.accounts)]

    def _user(self, number):
        account = self._account(number)

        def connect(rng):
            return self._client(account.token, pool_size=2, rng=rng)

        return User(number, account, self.plan, source=self.source, ledger=self.ledger, stop=self.stop,
                    clock=self.clock, end=self.end, drain_until=self.drain_until, connect=connect)

    def _find_source(self):
        if self.source or all(kind == 'rerank' for kind, weight in self.plan.mix if weight > 0):
            return
        token = self.plan.accounts[0].token
        with self._client(token) as client:
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
                thread = threading.Thread(target=self._user(number).run, daemon=True,
                                          name=f'heavy-lanes-load-user-{number}')
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
                account = self._account(call.user)
                client = clients.get(account.token)
                if client is None:
                    client = clients[account.token] = self._client(account.token)
                cancel(client, self.ledger, call, call.handle, self.clock)
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
