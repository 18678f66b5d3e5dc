"""The leases one admitted call holds, and the thread that renews them while it runs.

The token is the call's task id. The API takes the leases (capacity.gate) for as long as the call may
wait in its queue; the worker that runs it renews them at start (all or nothing: an expired lease is never
revived), every `renew_seconds` while it runs (up to `max_hold_seconds`), and releases them in `finally`.
A release that can't reach Redis (the skip window, or an error) is sent again later (capacity.releases).
A redelivered call (its worker died) takes them again with `retake`: it was admitted once.
Nothing here raises: the store's verbs fail open (capacity.store), and a lease keeps what they met in
`error` for the call's log line.
"""
import logging
import threading
import time

from capacity import counters, failopen
from capacity.store import Unknown, get_store

logger = logging.getLogger('heavy_lanes')


class Lease:
    def __init__(self, keys, token, lease_ms, holding=True, store=None, acquired_ms=0, within_limit=True):
        self.keys = list(keys)
        self.token = token
        self.lease_ms = int(lease_ms)
        self.acquired_ms = int(acquired_ms or 0)  # Redis's clock at the acquire: the hold is measured from it
        # False for a call shadow mode let past a full lane: its hold (mostly a wait behind the other calls
        # over the limit) is not what a refused caller waits for, so its release measures only its run.
        self.within_limit = bool(within_limit)
        self.holding = holding  # False for a call that went ahead uncounted: there is nothing to renew
        self.store = store or get_store()
        self.lease_lost = False
        self.renewals_failed = 0
        self.error = None
        self.released = False
        self.heard = None  # the processes its end's notice reached (PUBLISH's answer), when it went out

    def renew(self):
        """Extend every lease by lease_ms from now, or none of them; True when all were held."""
        if not self.holding or self.released:
            return False
        held = self.store.renew(self.keys, self.token, self.lease_ms)
        if isinstance(held, Unknown):
            if not held.skipped:  # a failure (the skip window sends nothing, and fails nothing)
                self.renewal_failed(held.error)
            return False
        if held < len(self.keys):
            self.lease_lost = True
            self.renewal_failed(None)
            return False
        return True

    def renewal_failed(self, error):
        self.renewals_failed += 1
        self.error = error or self.error
        counters.increment(('renewal_failed',))

    def counted(self):
        """Whether any lane still counts this call (holds its token with an unexpired lease), by Redis's
        clock; None when Redis can't say. Reads only: nothing is renewed or released."""
        if not self.keys:
            return None
        counted = self.store.counted(self.keys, self.token)
        return None if isinstance(counted, Unknown) else counted

    def retake(self, limits):
        """Take the leases again whatever the counts (a call that was admitted once); True when taken."""
        if not self.keys:
            return False
        acquired = self.store.acquire(self.keys, limits, self.token, self.lease_ms, force=True)
        if isinstance(acquired, Unknown):
            self.error = acquired.error if not acquired.skipped else self.error
            return False
        self.holding, self.lease_lost = True, False
        return True

    def release(self, keys=None, ran=None):
        """Remove this call's token from `keys` (default: all its lanes). Idempotent for the whole set.

        The release measures how long each lane held it (a call within the limit only: `within_limit`);
        `ran` = (queue, run_ms) also measures how long the call ran on its queue (capacity.decisions and the
        poll hints read both). A release that doesn't reach Redis is sent again once it answers (the store's).
        """
        if keys is None:
            if self.released:
                return
            self.released = True
            keys = self.keys
        if not self.holding or not keys:
            return
        self.note(self.store.release(list(keys), self.token, acquired_ms=self.acquired_ms, ran=ran,
                                     within_limit=self.within_limit))

    def release_and_end(self, ran=None, notice=None, work=None):
        """`release` (all its lanes, once) with the end's other Redis commands in its round trip
        (LaneStore.release_and_end): the completion notice, (channel, message), and a work's claim given up,
        (claim key, token, warm key, warm ms). Returns whether the notice went out; a notice that didn't is
        the caller's to send."""
        keys, token, acquired_ms, ran, notice, work, within_limit = self.end_step(ran, notice, work)
        ended = self.store.release_and_end(keys, token, acquired_ms=acquired_ms, ran=ran, notice=notice, work=work,
                                           within_limit=within_limit)
        return self.ended(ended, notice)

    def end_step(self, ran=None, notice=None, work=None):
        """This lease's part of a round trip of many ends (`release_and_end_all`): (keys, token,
        acquired_ms, ran, notice, work, within_limit), as `release_and_end` sends it; the lease counts as
        released."""
        keys = self.keys if self.holding and not self.released else []
        self.released = True
        return keys, self.token, self.acquired_ms, ran if keys else None, notice, work, self.within_limit

    def ended(self, ended, notice=None):
        """Keep what this lease's end in `release_and_end_all` met; whether its notice went out."""
        if self.note(ended) and isinstance(ended.removed, Exception):
            self.error = failopen.describe(ended.removed)
        sent = bool(ended) and notice is not None and not isinstance(ended.published, Exception)
        self.heard = ended.published if sent and isinstance(ended.published, int) else None
        return sent

    def note(self, answer):
        """Keep what a release met (an Unknown: skipped or failed, and deferred by the store); True when the
        release had an answer."""
        if isinstance(answer, Unknown):
            self.error = (self.error or failopen.RELEASE_DEFERRED) if answer.skipped else answer.error
            return False
        return True

    def drop(self, keys):
        """Release some lanes now and stop counting them as this call's (e.g. the API host's lane)."""
        keys = [key for key in keys if key in self.keys]
        self.release(keys)
        self.keys = [key for key in self.keys if key not in keys]


def release_and_end_all(ends, store=None):
    """`Lease.release_and_end` of many leases in one round trip: `ends` are (lease, notice, work) each;
    whether each one's notice went out, in order (one that didn't is the caller's to send)."""
    if not ends:
        return []
    store = store or ends[0][0].store
    answers = store.release_and_end_all([lease.end_step(notice=notice, work=work) for lease, notice, work in ends])
    if isinstance(answers, Unknown):
        answers = [answers] * len(ends)
    return [lease.ended(answer, notice) for (lease, notice, _), answer in zip(ends, answers)]


class LeaseRenewer(threading.Thread):
    """Renews a lease every `interval` s until stopped, the lease is lost, or `max_hold` s have passed.

    `on_tick()`, when given, runs every `tick` s (at most `interval`; the worker's heartbeat on the call's
    row), and then the thread goes on after a lost lease, only without renewing; `on_exit()` runs when the
    thread ends (it closes what the thread opened, e.g. its database connection).
    """

    def __init__(self, lease, interval, max_hold, clock=time.monotonic, on_tick=None, on_exit=None, tick=None):
        super().__init__(name='ocl-capacity-lease', daemon=True)
        self.lease = lease
        self.interval = interval
        self.tick = min(tick or interval, interval)
        self.deadline = clock() + max_hold
        self.clock = clock
        self.on_tick = on_tick
        self.on_exit = on_exit
        self.finished = threading.Event()
        self.renewals = 0

    def run(self):
        try:
            self.tick_until_stopped()
        finally:
            if self.on_exit is not None:
                self.on_exit()

    def tick_until_stopped(self):
        renewed_at = self.clock()
        while not self.finished.wait(self.tick):
            now = self.clock()
            if now >= self.deadline:
                return
            if not self.lease.lease_lost and now - renewed_at >= self.interval - 1e-3:
                renewed_at = now
                self.lease.renew()
                self.renewals += 1
            if self.on_tick is not None:
                try:
                    self.on_tick()
                except Exception:  # noqa: BLE001 - a missed beat must not end the renewals
                    logger.exception('Heartbeat failed; the next one may work')
            elif self.lease.lease_lost:
                # Renewing the rest would count the call in only some lanes.
                return

    def stop(self):
        # Don't wait out a renewal in flight: one that lands after the release only touches leases the
        # call still holds, so it changes nothing.
        self.finished.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(0.1)
