"""Closing the lane store's skip window as soon as Redis answers again.

After a Redis error a process skips Redis for the limiter (capacity.store: the skip window), so an outage
costs at most one call per process, by at most the deadline. Left at that, a 0.8 s pause would leave every
process admitting uncounted for the whole window (CAPACITY_REDIS_RETRY_SECONDS, 15 s): enforce mode with no
limit. The Prober closes the window instead once Redis answers: one thread per process, started by the error
that opened the window and gone when it closes, PINGs Redis every CAPACITY_REDIS_PROBE_SECONDS (each PING
bounded by the deadline, off the request path). The window's length stays the upper bound.

The probe is also the evidence the window needs when an error may be the process's own (capacity.failopen):
a busy or starved process misses the deadline with Redis answering fine, so then it PINGs at once and opens
the window only when that PING gets no answer either. Its PING is read from its socket, so a starved
process still finds an answer Redis gave.

Written by hand: circuit-breaker libraries (pybreaker, circuitbreaker) count failures of the calls they wrap
and let a trial call through to find out; here no request may pay for the trial, and the window's rule (a
limiter failure never refuses) is capacity.store's.
"""
import logging
import threading
import time

from django.conf import settings

logger = logging.getLogger('heavy_lanes')


def probe_seconds():
    """How often a process with its skip window open PINGs Redis; 0 turns the probe off (the window runs
    its full length)."""
    return float(getattr(settings, 'CAPACITY_REDIS_PROBE_SECONDS', 0.5) or 0)


class Prober:
    """One process's probe of Redis while `store`'s skip window is open, or while an error that may be the
    process's own slowness waits for its word (at most one thread at a time)."""

    def __init__(self, store):
        self.store = store
        self.lock = threading.Lock()
        self.thread = None
        self.probes = 0  # PINGs sent (tests, and the log line when it closes the window)
        self.started = 0  # probe threads started (tests: one at a time, however many errors)

    def start(self):
        """Probe until the window closes, unless a probe runs already (call after opening the window)."""
        interval = probe_seconds()
        if interval <= 0:
            return
        self._start(interval, verify=False)

    def verify(self):
        """Ask Redis now whether it answers, off the caller's path: if it doesn't, open the window (and probe
        on until it answers); if it does, the window stays shut. Nothing when a probe runs already: its
        answer is the one this asks for."""
        self._start(probe_seconds(), verify=True)

    def _start(self, interval, verify):
        with self.lock:
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self.run, args=(interval, verify), name='heavy-lanes-redis-probe',
                                           daemon=True)
            self.thread.start()
            self.started += 1

    def run(self, interval, verify=False):
        opened = time.monotonic()
        if verify:
            self.probes += 1
            answer = self.store.probe()
            if answer is True:
                with self.lock:
                    self.thread = None
                return
            logger.warning('Redis gave the probe no answer (%s): the limiter skips it until it answers',
                           answer.error)
            self.store.open_window()
            if interval <= 0:
                with self.lock:
                    self.thread = None
                return
        while True:
            time.sleep(interval)  # the error that opened the window was just met: look again in a moment
            answered = False
            if not self.store.is_available():
                self.probes += 1
                answered = self.store.probe() is True
                if answered:
                    logger.warning('Redis answers again after %.1f s: the limiter counts again',
                                   time.monotonic() - opened)
            with self.lock:
                # Decided under the lock, on the window as it is now (an answer closed it; an error since may
                # have opened it again): an error that opens it after this starts a new probe.
                if self.store.is_available():
                    self.thread = None
                    return
